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
