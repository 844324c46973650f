"""``max_inflight_bytes``: the bytes of batches being made or waiting stay within the budget.

The scheduler tests drive EpochRun with a pool that finishes every task the moment it can (an
infinitely slow consumer, the worst case for memory) and add up, after every call, the bytes
of every batch that exists: submitted and not yet handed out. No timing is involved. The
Loader test measures RSS with a slow consumer over batches of varying size, with a generous
bound that buffering by count alone would break.
"""

import itertools
import time

import numpy as np
import psutil
import pytest
from test_memory import PeakSampler

from steadyfeed import Loader
from steadyfeed.execution.handoff import FixedHandoff
from steadyfeed.execution.protocol import Done
from steadyfeed.execution.scheduler import ByteBudget, EpochRun
from steadyfeed.execution.task import BatchResult
from steadyfeed.sampling.plan import build_plan
from steadyfeed.stats import LoaderStats

pytestmark = pytest.mark.timeout(120)

KIB = 1024


class EagerPool:
    """Finishes every task it holds whenever the scheduler looks (drain or wait), each batch
    ``size_of(index)`` bytes; records the peak bytes of the batches in flight or waiting: every
    batch submitted and not yet handed out (the one the consumer holds is its own)."""

    def __init__(self, size_of, capacity=64):
        self.size_of, self.capacity = size_of, capacity
        self.pending, self.submitted, self.peak, self.submitted_before_first_result = [], [], 0, None
        self.run = None  # the EpochRun, whose next_to_yield says which batches were handed out

    def free_slots(self):
        return self.capacity - len(self.pending)

    def idle_workers(self):
        return int(not self.pending)  # one worker, busy with whatever it holds

    def submit(self, task):
        self.pending.append(task)
        self.submitted.append(task.spec.index)  # a batch being made holds its bytes
        alive = [i for i in self.submitted if i >= self.run.next_to_yield]
        self.peak = max(self.peak, sum(self.size_of(i) for i in alive))

    def drain(self):
        if self.submitted_before_first_result is None:
            self.submitted_before_first_result = len(self.pending)
        done, self.pending = self.pending, []
        return [
            Done(BatchResult(t.task_id, t.spec.index, {"x": np.zeros(self.size_of(t.spec.index), np.uint8)}, (), {}))
            for t in done
        ]

    wait = lambda self, timeout: self.drain()  # noqa: E731

    def run_here(self, task):
        raise AssertionError("all batches go to the workers here")

    def shutdown(self):
        pass


def run(pool, limit, n_batches=40, prefetch=16, budget=None):
    plan = build_plan(
        np.arange(n_batches, dtype=np.int64),
        batch_size=1,
        shard_index=0,
        shard_count=1,
        last_batch="partial",
        with_draws=False,
    )
    budget = budget if budget is not None else ByteBudget(limit)
    epoch = EpochRun(
        pool,
        plan,
        epoch=0,
        start=0,
        prefetch=prefetch,
        retries=0,
        stop_on_failure=False,
        task_ids=itertools.count(),
        max_blameless_deaths=3,
        stats=LoaderStats(),
        handoff=FixedHandoff(to_workers=True),
        budget=budget,
    )
    pool.run = epoch
    return [outcome.spec.index for outcome in epoch]


def varying(index):
    """Big images among small ones; the largest (64 KiB) comes first, the rest vary 4-40 KiB."""
    return 64 * KIB if index == 0 else (4 + (index * 7) % 37) * KIB


def test_bytes_in_flight_and_waiting_stay_within_the_budget():
    pool = EagerPool(varying)
    assert run(pool, limit=200 * KIB) == list(range(40))
    assert pool.peak <= 200 * KIB
    unbounded = EagerPool(varying)
    run(unbounded, limit=None)
    assert unbounded.peak > 300 * KIB  # the test could fail: prefetch alone lets 16 batches pile up


def test_until_a_batch_is_measured_one_at_a_time():
    pool = EagerPool(varying)
    run(pool, limit=10 * 2**20)
    assert pool.submitted_before_first_result == 1


def test_what_was_learnt_carries_over_to_the_next_epoch():
    budget = ByteBudget(200 * KIB)
    run(EagerPool(varying), limit=None, budget=budget)
    pool = EagerPool(varying)
    run(pool, limit=None, budget=budget)
    assert pool.submitted_before_first_result > 1 and pool.peak <= 200 * KIB


def test_a_batch_larger_than_the_budget_is_still_made_alone():
    pool = EagerPool(lambda index: 100 * KIB)
    assert run(pool, limit=10 * KIB) == list(range(40))  # never stuck
    assert pool.peak == 100 * KIB  # one at a time (besides the one the consumer holds)


def test_an_unmeasured_larger_batch_overshoots_by_its_excess_only():
    """The estimate is the largest batch seen: a bigger one can exceed its share, once."""
    sizes = lambda index: 64 * KIB if index == 20 else 8 * KIB  # noqa: E731
    pool = EagerPool(sizes)
    run(pool, limit=80 * KIB)
    assert pool.peak <= 80 * KIB + (64 - 8) * KIB


def test_option_is_checked():
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        Loader(np.zeros(3), 1, max_inflight_bytes=0)


class GrowingImages:
    """Samples of 1 to 4 MiB (uint8, fresh each read), like images of many sizes."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return {"x": np.full((1 + (i * 5) % 4) << 20, i % 251, np.uint8)}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_rss_with_a_slow_consumer_stays_within_budget_plus_the_stated_constant(mode, no_leaks):
    """Stated in the README: memory stays within max_inflight_bytes + (workers + 1) x the largest
    batch (each worker's samples while it builds a batch, and the batch the consumer holds) + a
    fixed overhead (SLACK); in process mode the workers' shared-memory slots (2 per worker, of
    its largest batch; counted here with RSS) take the workers' share instead. Prefetch alone
    (24 batches of up to 8 MiB) would hold far more."""
    budget, workers, largest = 24 << 20, 2, 8 << 20  # batches of two samples of up to 4 MiB
    with Loader(
        GrowingImages(), 2, workers=workers, mode=mode, prefetch=24, collate="pad", max_inflight_bytes=budget
    ) as loader:
        baseline = psutil.Process().memory_info().rss
        sampler = PeakSampler()
        sampler.start()
        count = 0
        for batch in loader.epoch(0):
            count += 1
            del batch
            time.sleep(0.02)  # a slow training step: the workers fill whatever the window allows
        peak = sampler.stop()
    slack = 48 << 20
    per_worker = 2 if mode == "process" else 1
    bound = budget + (per_worker * workers + 1) * largest + slack
    assert count == 48
    assert peak - baseline < bound, f"grew {(peak - baseline) >> 20} MiB, bound {bound >> 20} MiB"
    assert bound < 24 * 5 << 20  # could fail: 24 waiting batches of 5 MiB on average exceed it
