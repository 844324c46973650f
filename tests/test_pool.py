"""Pools (execution/pool.py): which worker gets a task."""

import os

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(60)


def with_maker(sample, rng):
    """The sample, with the process that made it."""
    return {**sample, "pid": np.int64(os.getpid())}


def test_process_tasks_go_round_idle_workers_rather_than_all_to_the_first(no_leaks):
    """prefetch=1: one batch at a time, so every worker is idle at every submit. Each batch
    goes to the worker whose last task is oldest: they take turns, whatever their speeds (a
    worker lends only a few batches at once; one worker making them all would copy the rest)."""
    options = dict(workers=3, mode="process", prefetch=1, inline_when_faster=False)
    with Loader(paired_source(48), 4, transform=with_maker, with_ids=True, **options) as loader:
        batches = list(loader.epoch(0))
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]), np.arange(48))
    makers = [int(b["pid"][0]) for b in batches]
    assert all(len(set(b["pid"].tolist())) == 1 for b in batches)  # a batch is one worker's
    assert len(set(makers)) == 3 and makers == makers[:3] * 4  # the same three in turn


def test_a_process_worker_holding_more_lent_batches_gets_tasks_after_the_other(no_leaks):
    """The consumer keeps every batch of one worker (prefetch=1: both idle at every submit).
    Going round, that worker would hold all it may lend (``shm.LENT_SLOTS``) by its seventh
    batch and copy the rest out of its slots; the worker holding fewer lent batches goes first,
    so every batch is lent."""
    from steadyfeed.execution import shm

    options = dict(workers=2, mode="process", prefetch=1, inline_when_faster=False)
    kept, first = [], None
    with Loader(paired_source(96), 4, transform=with_maker, **options) as loader:
        for batch in loader.epoch(0):
            first = int(batch["pid"][0]) if first is None else first
            if int(batch["pid"][0]) == first:
                kept.append(batch)
        lent = loader.stats()["lent_batches"]
    count = len(kept)
    del kept, batch  # the lent batches go before the leak check
    assert lent == 24 and 1 <= count < shm.LENT_SLOTS


def test_a_process_worker_that_may_lend_no_more_comes_after_a_busier_one():
    """Its next batch would be copied out of its slot; another worker's queue is cheaper. Of
    the rest: fewer tasks, then fewer slots held by lent batches. (The choice alone: no processes.)"""
    from steadyfeed.execution import shm
    from steadyfeed.execution.pool import ProcessPool

    class Worker:
        def __init__(self, tasks, held):
            self.outstanding, self.held = dict.fromkeys(range(tasks)), {f"slot{k}" for k in range(held)}

        def held_slots(self):
            return self.held

    pool = ProcessPool.__new__(ProcessPool)
    pool._last_task = {}

    def pick(*workers):
        pool.workers = dict(enumerate(workers))
        return pool._least_busy()

    full = shm.LENT_SLOTS
    assert pick(Worker(0, full), Worker(1, 2)) == 1
    assert pick(Worker(0, full), Worker(1, full)) == 0
    assert pick(Worker(1, 0), Worker(0, full - 1)) == 1
    assert pick(Worker(0, 3), Worker(0, 2)) == 1


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_pool_knows_once_every_worker_has_returned_a_result(mode, no_leaks):
    """What ``workers="auto"``'s trial waits for before it times a pool (a spawned worker may
    take seconds to start while the other makes every batch)."""
    from steadyfeed.execution.pool import InlinePool, make_pool
    from steadyfeed.execution.protocol import Done
    from steadyfeed.execution.task import BatchTask, WorkContext
    from steadyfeed.sampling.plan import BatchSpec

    ctx = WorkContext(paired_source(8), None, 0, 0, True, 0, "stack")
    assert InlinePool(ctx).all_delivered
    pool = make_pool(mode, 2, ctx, None)
    try:
        assert not pool.all_delivered
        for task_id in range(2):  # both idle at each submit: the second goes to the other worker
            pool.submit(
                BatchTask(task_id, 0, BatchSpec(task_id, np.arange(4 * task_id, 4 * task_id + 4), None, None, 4))
            )
            assert not pool.all_delivered
            events = []
            while not events:
                events = pool.wait(1.0)
            assert [type(e) for e in events] == [Done]
            del events  # a process worker's batch lends its slot
        assert pool.all_delivered
    finally:
        pool.shutdown()
