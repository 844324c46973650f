"""Several batches in one task (``execution/grouping.py``, ``batches_per_task``): whatever the
tasks meet (failures, deaths, timeouts, ragged data, any order of results), the consumer gets
what tasks of one batch each would have given it.

The scheduler half runs the real ``run_batch`` in a pool that finishes tasks in a scripted
order and loses workers where told; the loader half runs real threads and processes.
"""

import os

import numpy as np
import pytest
from helpers import FaultySource, ScriptedPool, epoch_digest, epoch_run, failing_transform, noisy, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import Loader, SampleError, WorkerDied
from steadyfeed.config import ExecutionOptions
from steadyfeed.execution import grouping as grouping_module
from steadyfeed.execution import shm
from steadyfeed.execution.batch import run_batch
from steadyfeed.execution.grouping import (
    LEARN_BATCHES,
    TASK_SECONDS,
    Grouping,
    make_grouping,
    member_at,
    mergeable,
    merged,
    split,
)
from steadyfeed.execution.pool import SLOTS_PER_WORKER, TASKS_PER_WORKER
from steadyfeed.execution.protocol import Done
from steadyfeed.execution.task import Stage, StatusSlot, WorkContext
from steadyfeed.sampling.plan import BatchSpec


# -- the pieces ------------------------------------------------------------------------------------
def spec(index, ids, draws=None):
    return BatchSpec(
        index, np.array(ids, np.int64), None if draws is None else np.array(draws, np.int64), None, len(ids)
    )


def test_merged_holds_the_batches_ids_and_draws_in_order_and_split_cuts_them_back():
    specs = [spec(3, [7, 1], [0, 5]), spec(4, [9], [2]), spec(5, [4, 4, 8], [1, 3, 6])]
    one = merged(specs)
    assert (one.index, one.ids.tolist(), one.draws.tolist(), one.pad_to, one.num_real) == (
        3,
        [7, 1, 9, 4, 4, 8],
        [0, 5, 2, 1, 3, 6],
        None,
        6,
    )
    rows = {"x": np.arange(12).reshape(6, 2), "id": one.ids}
    parts = split(rows, specs)
    assert [p["id"].tolist() for p in parts] == [[7, 1], [9], [4, 4, 8]]
    assert parts[2]["x"].tolist() == [[6, 7], [8, 9], [10, 11]]
    assert [member_at(specs, p) for p in range(6)] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    with pytest.raises(IndexError):
        member_at(specs, 6)


def test_only_batches_whose_rows_are_their_ids_merge():
    assert mergeable(spec(0, [1, 2]))
    assert not mergeable(BatchSpec(0, np.array([1, 2]), None, 4, 2))  # padded under last_batch="pad"
    assert not mergeable(BatchSpec(0, np.array([1, 2, 0]), None, 3, 2))  # a filler row
    assert Grouping(3).active and not Grouping(1).active and not Grouping(3, stopped="ragged").active


# -- the scheduler, with the real run_batch ----------------------------------------------------------
def DeferredPool(ctx, order="lifo", lose=lambda task: None, capacity=4, workers=2):  # noqa: N802 - a pool's name
    """A scripted pool (``helpers.ScriptedPool``) whose tasks are made with the real ``run_batch``
    when the scheduler waits; ``lose(task)`` loses a worker instead, where it says."""
    return ScriptedPool(
        lose, capacity, order, finish=lambda task: run_batch(task, ctx, StatusSlot([-1, -1, 0.0])), workers=workers
    )


def epoch_of(pool, n, batch_size, size, retries=0, stop_on_failure=False, prefetch=8, grouping=None):
    grouping = grouping if grouping is not None else Grouping(size)
    run = epoch_run(
        pool, n, batch_size, prefetch=prefetch, retries=retries, stop_on_failure=stop_on_failure, grouping=grouping
    )
    outcomes = []
    for outcome in run:
        outcomes.append(seen(outcome))
        if stop_on_failure and outcome.failures:
            break  # the loader raises here
    return outcomes


def seen(outcome):
    """What the loader takes from an outcome."""
    arrays = None if outcome.arrays is None else {k: v.tolist() for k, v in outcome.arrays.items()}
    failures = [(f.position, f.sample_id, f.attempts, f.error_type, f.cause) for f in outcome.failures]
    return outcome.spec.index, arrays, failures, outcome.disagreement


def context(source, transform=None, retries=0, stop_on_failure=False):
    return WorkContext(source, transform, seed=0, retries=retries, stop_on_failure=stop_on_failure)


def batches_in_tasks(pool):
    return [len(t.spec.ids) for t in pool.submitted]


@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_groups_are_cut_back_into_the_batches_of_the_plan(order):
    source = paired_source(40)
    alone = epoch_of(DeferredPool(context(source), order), 40, 4, size=1)
    pool = DeferredPool(context(source), order)
    assert epoch_of(pool, 40, 4, size=3) == alone
    assert max(batches_in_tasks(pool)) == 12  # three batches of 4 in one task
    assert sum(batches_in_tasks(pool)) == 40  # every sample read once


def test_the_last_tasks_of_an_epoch_shrink_to_a_share_of_the_rest_per_worker():
    """Guided: whole tasks of 4 would leave one of 2 workers idle while the other makes the
    epoch's last; each task holds at most half of what is left, so they finish together."""
    source = paired_source(160)
    alone = epoch_of(DeferredPool(context(source), "fifo"), 160, 4, size=1)
    pool = DeferredPool(context(source), "fifo")
    assert epoch_of(pool, 160, 4, size=4, prefetch=64, grouping=Grouping(4, workers=2)) == alone
    assert [rows // 4 for rows in batches_in_tasks(pool)] == [4] * 9 + [2, 1, 1]
    assert [Grouping(8, workers=3).size_at(r) for r in (100, 24, 23, 7, 3, 1)] == [8, 8, 8, 3, 1, 1]


def test_a_group_teaches_the_byte_budget_its_largest_batch():
    """A group's batches arrive together and teach the budget once: the largest of them, as
    each made alone would have (the group that ends the plan holds its short last batch)."""
    run = epoch_run(DeferredPool(context(paired_source(6))), 6, 4, prefetch=8, grouping=Grouping(2))
    outcomes = list(run)
    assert [len(o.arrays["id"]) for o in outcomes] == [4, 2]
    assert run.budget.largest == sum(a.nbytes for a in outcomes[0].arrays.values())


@pytest.mark.parametrize("stop_on_failure", [False, True])
def test_a_sample_failing_in_a_group_fails_once_and_the_other_batches_are_made_alone(stop_on_failure):
    source = FaultySource(40, fail={13, 14, 27})
    alone = epoch_of(DeferredPool(context(source, stop_on_failure=stop_on_failure)), 40, 4, 1, 0, stop_on_failure)
    pool = DeferredPool(context(source, stop_on_failure=stop_on_failure))
    grouped = epoch_of(pool, 40, 4, 3, 0, stop_on_failure)
    assert grouped == alone
    assert alone[3][2][0][:2] == (1, 13)  # batch 3, its position 1: sample 13
    rerun = [t for t in pool.submitted if t.spec.index == 3 and len(t.spec.ids) == 4]
    if not stop_on_failure:  # made again alone, without the samples that failed for good
        assert [t.excluded for t in rerun] == [frozenset({1, 2})]
    else:  # raised as it is: never made again
        assert rerun == []


def test_a_failing_sample_is_tried_no_more_often_than_retries_allow():
    calls = []

    def counted(sample, rng):
        calls.append(int(sample["x"][0]) // 4)
        return failing_transform(sample, rng)

    source = paired_source(24)
    grouped = epoch_of(DeferredPool(context(source, counted, retries=2)), 24, 4, 3, retries=2)
    assert calls.count(3) == 3 and calls.count(11) == 3  # three attempts each, in the group, none again
    assert [f[:3] for o in grouped for f in o[2]] == [(3, 3, 3), (3, 11, 3)]


@pytest.mark.parametrize(
    "where,blamed",
    [(5, True), (Stage.READING_BATCH, False), (Stage.COLLATING, False), (None, False)],
)
def test_a_worker_lost_on_a_group_charges_the_sample_it_was_on(where, blamed):
    """Lost at position 5 of a group of batches 0-2 (4 each): sample 5, position 1 of batch 1,
    fails for good (retries=0). Lost elsewhere, no sample is charged; a death while collating
    counts against the group's first batch, within retries (then it raises, as alone)."""
    source = paired_source(24)
    lost = []

    def lose(task):
        if not lost and len(task.spec.ids) == 12:
            lost.append(task)
            return where, "died"
        return None

    pool = DeferredPool(context(source), "fifo", lose)
    grouped = epoch_of(pool, 24, 4, 3, retries=int(where is Stage.COLLATING))
    alone = epoch_of(DeferredPool(context(source), "fifo"), 24, 4, 1)
    failures = [(o[0], f[:3]) for o in grouped for f in o[2]]
    if not blamed:
        assert grouped == alone
    else:
        assert failures == [(1, (1, 5, 1))] and [f[3:] for o in grouped for f in o[2]] == [("WorkerDied", "died")]
        assert [o for o in grouped if o[0] != 1] == [o for o in alone if o[0] != 1]
        assert grouped[1][1]["id"] == [4, 6, 7]
    again = {t.spec.index: t for t in pool.submitted[1:] if t.spec.index < 3 and len(t.spec.ids) == 4}
    assert sorted(again) == [0, 1, 2]  # each batch of the lost group went again, alone
    if where is Stage.READING_BATCH:
        assert not any(t.batched_read for t in again.values())


def test_deaths_while_collating_a_group_raise_past_retries():
    lose = lambda task: (Stage.COLLATING, "died") if len(task.spec.ids) == 12 else None  # noqa: E731
    with pytest.raises(WorkerDied, match="while collating batch 0"):
        epoch_of(DeferredPool(context(paired_source(24)), "fifo", lose), 24, 4, 3, retries=0)


def test_batches_that_collate_alone_but_not_together_stop_the_grouping():
    class Ragged:
        """Sample i has i // 8 + 1 values: batches of 4 agree, three of them in a row may not."""

        def __len__(self):
            return 32

        def __getitem__(self, i):
            return {"x": np.full(i // 8 + 1, i, np.int64)}

    grouping = Grouping(3)
    pool = DeferredPool(context(Ragged()), "fifo")
    grouped = epoch_of(pool, 32, 4, 3, grouping=grouping)
    assert grouped == epoch_of(DeferredPool(context(Ragged()), "fifo"), 32, 4, 1)
    assert all(o[3] is None for o in grouped)  # no batch is reported as one that cannot be collated
    assert "cannot be collated together" in grouping.stopped
    first_alone = next(k for k, t in enumerate(pool.submitted) if len(t.spec.ids) == 4)
    assert all(len(t.spec.ids) == 4 for t in pool.submitted[first_alone:])


@pytest.mark.parametrize("workers,prefetch", [(1, 5), (0, 2)])
def test_a_group_short_of_its_size_waits_only_while_the_workers_have_work(workers, prefetch):
    """Groups of 3 in a window of 5 fill only as batches are taken; in a window of 2 they never
    fill. A short group goes when a worker has nothing to do or, whatever the workers report
    (0: never idle), when the consumer waits for its first batch: nothing hangs."""
    pool = DeferredPool(context(paired_source(40)), "fifo", capacity=2, workers=workers)
    outcomes = epoch_of(pool, 40, 4, 3, prefetch=prefetch)
    assert [o[0] for o in outcomes] == list(range(10))
    assert sum(batches_in_tasks(pool)) == 40


class WorkersAhead(ScriptedPool):
    """Workers faster than the consumer: every task sent is done by the next drain."""

    def drain(self):
        done = [Done(self.finish(task)) for task in self.pending]
        self.pending.clear()
        return done


def test_a_consumer_slower_than_its_workers_gets_whole_tasks():
    """Its window is full of ready batches and frees one place a batch taken, while both
    workers sit idle: a place sent at once would make every task one batch (2 processes, a
    1 ms training step: half the batches then copied out of slots instead of lent)."""
    source = paired_source(400)
    pool = WorkersAhead(finish=lambda task: run_batch(task, context(source), StatusSlot([-1, -1, 0.0])))
    grouping = Grouping(4, workers=2, grows_window=True)  # a window of 8 tasks of 4
    outcomes = epoch_of(pool, 400, 4, 4, prefetch=8, grouping=grouping)
    assert outcomes == epoch_of(DeferredPool(context(source), "fifo"), 400, 4, 1, prefetch=8)
    batches = [len(task.spec.ids) // 4 for task in pool.submitted]
    assert sum(batches) == 100 and batches.count(4) >= 24  # whole tasks but for the epoch's last few


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    batch_size=st.integers(1, 7),
    size=st.integers(2, 5),
    prefetch=st.integers(1, 16),
    failing=st.sets(st.integers(0, 59), max_size=6),
    order=st.sampled_from(["lifo", "fifo"]),
    stop_on_failure=st.booleans(),
)
def test_any_grouping_gives_what_tasks_of_one_batch_give(
    n, batch_size, size, prefetch, failing, order, stop_on_failure
):
    source = FaultySource(n, fail=failing)
    alone = epoch_of(
        DeferredPool(context(source, stop_on_failure=stop_on_failure), order),
        n,
        batch_size,
        1,
        stop_on_failure=stop_on_failure,
        prefetch=prefetch,
    )
    grouped = epoch_of(
        DeferredPool(context(source, stop_on_failure=stop_on_failure), order),
        n,
        batch_size,
        size,
        stop_on_failure=stop_on_failure,
        prefetch=prefetch,
    )
    assert grouped == alone


# -- the loader, with real workers -----------------------------------------------------------------
MODES = [(2, "thread"), (2, "process")]
pytestmark_loader = pytest.mark.timeout(120)


@pytestmark_loader
@pytest.mark.parametrize("workers,mode", MODES)
def test_batches_are_bit_identical_whatever_the_batches_per_task(workers, mode, no_leaks):
    def digest(**options):
        with Loader(paired_source(103), 4, shuffle=True, seed=5, transform=noisy, with_ids=True, **options) as loader:
            return [epoch_digest(loader.epoch(e)) for e in range(2)], loader.stats()

    reference, _ = digest(workers=0)
    for size in (2, 3, 8):
        digests, stats = digest(workers=workers, mode=mode, batches_per_task=size, inline_when_faster=False)
        assert digests == reference, size
        assert stats["prefetch"] == 4 * workers * size  # the default window counts tasks of `size`


@pytestmark_loader
@pytest.mark.parametrize("workers,mode", MODES)
def test_failures_in_groups_are_reported_as_without_groups(workers, mode, marker_dir, no_leaks):
    def run(**options):
        # markers of its own: each run's flaky samples fail their first attempt
        own = os.path.join(marker_dir, str(len(os.listdir(marker_dir))))
        os.mkdir(own)
        source = FaultySource(40, fail={0, 13, 39}, flaky={7, 21}, marker_dir=own)
        with Loader(source, 4, with_ids=True, on_error="skip", retries=1, **options) as loader:
            ids = [b["id"].tolist() for b in loader]
            return ids, loader.quarantine_report()

    assert run(workers=workers, mode=mode, batches_per_task=3) == run(workers=0)


@pytestmark_loader
@pytest.mark.parametrize("workers,mode", MODES)
def test_under_raise_a_group_raises_the_first_failure_with_its_batch(workers, mode, no_leaks):
    source = FaultySource(40, fail={13, 14})
    with Loader(source, 4, workers=workers, mode=mode, batches_per_task=4) as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert (info.value.sample_id, info.value.batch_index, info.value.attempts) == (13, 3, 1)


@pytestmark_loader
def test_a_process_killed_by_a_sample_in_a_group_names_that_sample(marker_dir, no_leaks):
    source = FaultySource(40, kill={9}, marker_dir=marker_dir)
    with Loader(source, 4, workers=2, mode="process", with_ids=True, batches_per_task=3) as loader:
        with pytest.raises(WorkerDied) as info:
            list(loader)
    assert (info.value.sample_id, info.value.batch_index) == (9, 2)


@pytestmark_loader
@pytest.mark.parametrize("workers,mode", MODES)
def test_a_sample_hung_in_a_group_times_out_alone(workers, mode, marker_dir, no_leaks):
    source = FaultySource(40, hang={17}, marker_dir=marker_dir)
    try:
        with Loader(
            source, 4, workers=workers, mode=mode, timeout=0.5, on_error="skip", with_ids=True, batches_per_task=3
        ) as loader:
            ids = sorted(i for b in loader for i in b["id"].tolist())
            report = loader.quarantine_report()
    finally:
        open(os.path.join(marker_dir, "release"), "w").close()  # let the abandoned thread finish
    assert ids == [i for i in range(40) if i != 17]
    assert [(r["sample_id"], r["batch_index"], r["error_type"]) for r in report] == [(17, 4, "SampleTimeout")]


@pytestmark_loader
def test_a_resumed_epoch_starting_inside_a_group_is_the_same(no_leaks):
    with Loader(paired_source(60), 4, shuffle=True, seed=2, with_ids=True) as loader:
        whole = [b["id"].tolist() for b in loader.epoch(0)]
    with Loader(paired_source(60), 4, shuffle=True, seed=2, with_ids=True, workers=2, batches_per_task=4) as loader:
        loader.seek(0, 5)
        assert [b["id"].tolist() for b in loader] == whole[5:]


def test_pad_collation_never_groups():
    with Loader(paired_source(12), 4, collate="pad", workers=1, batches_per_task=3) as loader:
        assert loader.stats()["batches_per_task"] == 1
        list(loader)


# -- "auto": how many batches a task holds -----------------------------------------------------------
def test_process_workers_hold_more_cheap_batches_a_task_than_threads():
    thread, process = (make_grouping(ExecutionOptions(workers=2, mode=m), "stack") for m in ("thread", "process"))
    for g in (thread, process):
        for _ in range(g.warmup + LEARN_BATCHES):
            g.learn(0.0001, 100)  # 500 make a task of TASK_SECONDS
    assert thread.in_use == grouping_module.MAX_BATCHES and process.in_use == grouping_module.MAX_PROCESS_BATCHES
    assert process.picked.startswith(f"{grouping_module.MAX_PROCESS_BATCHES} batch(es) a task")


def test_auto_picks_after_learning_enough_batches_within_time_room_and_limit():
    grouping = Grouping(auto=True, room=10_000, copies=10)
    for _ in range(LEARN_BATCHES - 1):
        grouping.learn(0.001, 100)
    assert grouping.in_use == 1 and grouping.picked is None  # still learning
    grouping.learn(0.001, 100)
    assert grouping.in_use == 8 and "8 batch(es) a task" in grouping.picked  # 20 ms needs 20: capped at 8
    grouping.learn(1.0, 10**9)
    assert grouping.in_use == 8  # picked once

    def picked(seconds, nbytes, **kw):
        g = Grouping(auto=True, **kw)
        for _ in range(LEARN_BATCHES):
            g.learn(seconds, nbytes)
        return g.in_use

    assert picked(TASK_SECONDS / 3, 100) == 3  # a task of about TASK_SECONDS
    assert picked(TASK_SECONDS * 2, 100) == 1  # batches that cost more than that: one a task
    assert picked(0.0, 100, room=5 * 4 * 100, copies=4) == 5  # as many as the room holds, `copies` times
    assert picked(0.0, 100, room=50, copies=4) == 1
    tight = Grouping(auto=True, room=50, copies=4)
    for _ in range(LEARN_BATCHES):
        tight.learn(0.0, 100)
    assert "not even one batch a task fits the memory allowed" in tight.picked  # not "0 fit"
    assert picked(0.0, 100, limit=2) == 2
    assert not Grouping(size=1).active and Grouping(size=3).window_factor == 1
    assert Grouping(size=3, grows_window=True).window_factor == 3


def test_a_pools_first_batches_into_fresh_memory_teach_auto_nothing():
    """A pool's first batches (a slot made for each of a process worker's first tasks, its pages
    faulted in) cost several times what later ones do: learning starts after them."""
    for mode in ("thread", "process"):
        grouping = make_grouping(ExecutionOptions(workers=2, mode=mode), "stack")
        assert grouping.warmup == 2 * SLOTS_PER_WORKER
        for _ in range(2 * SLOTS_PER_WORKER):
            grouping.learn(1.0, 100)  # slow: one a task, were they counted
        for _ in range(LEARN_BATCHES):
            grouping.learn(0.0001, 100)
        assert grouping.in_use == grouping.cap and "a batch took 0.10 ms" in grouping.picked


def test_process_workers_group_within_half_of_the_free_shared_memory(monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda: 1000)
    process = make_grouping(ExecutionOptions(workers=2, mode="process"), "stack")
    assert process.room == 500  # at most half of /dev/shm's free space, slots and window together
    for _ in range(process.warmup + LEARN_BATCHES):
        process.learn(0.0001, 15)  # 24 copies (a window of 8, 8 slots a worker) of 15 bytes: 360 fit, 720 not
    assert process.in_use == 1
    monkeypatch.setattr(shm, "free_bytes", lambda: None)  # unknown: the memory budget alone
    assert make_grouping(ExecutionOptions(workers=2, mode="process", max_inflight_bytes=7), "stack").room == 7


def test_which_loaders_group():
    def grouping(collate="stack", **execution):
        return make_grouping(ExecutionOptions(**execution), collate)

    assert not grouping(workers=0).auto and grouping(workers=0).in_use == 1
    assert (
        not grouping(workers=2, collate="pad").auto
        and grouping(workers=2, collate="pad", batches_per_task=3).in_use == 1
    )
    assert grouping(workers=2, batches_per_task=3).in_use == 3 and grouping(workers=2, batches_per_task=3).grows_window
    assert not grouping(workers=2, batches_per_task=3, prefetch=6).grows_window
    assert not grouping(workers=2, mode="ray").auto and grouping(workers=2, mode="ray", batches_per_task=2).in_use == 2
    thread, process = grouping(workers=2), grouping(workers=2, mode="process")
    assert thread.auto and thread.copies == 8 and process.copies == 8 + 2 * (TASKS_PER_WORKER + shm.LENT_SLOTS)
    assert grouping(workers=2, prefetch=16).limit == 2 and grouping(workers=2, prefetch=5).limit == 1
    assert grouping(workers=2, max_inflight_bytes=1000).room == 1000


@pytestmark_loader
@pytest.mark.parametrize("workers,mode", MODES)
def test_by_default_a_loader_of_cheap_batches_groups_them_and_says_why(workers, mode, monkeypatch, no_leaks):
    monkeypatch.setattr(grouping_module, "TASK_SECONDS", 1e9)  # any batch is cheap: the pick rests on room alone
    with Loader(paired_source(400), 4, workers=workers, mode=mode, with_ids=True, inline_when_faster=False) as loader:
        ids = [i for b in loader for i in b["id"].tolist()]
        stats = loader.stats()
    assert ids == list(range(400))
    cap = grouping_module.MAX_PROCESS_BATCHES if mode == "process" else grouping_module.MAX_BATCHES
    assert stats["batches_per_task"] == cap and stats["prefetch"] == 4 * workers * cap
    assert stats["grouping"].startswith(f"{cap} batch(es) a task")
    room = 3 * 8 * (4 * 4 * 8 + 4 * 8 + 4 * 8)  # three times the window of 8 batches of 192 bytes (x, y, id)
    with Loader(paired_source(400), 4, workers=2, with_ids=True, max_inflight_bytes=room) as loader:
        list(loader)
        assert loader.stats()["batches_per_task"] == 3


@pytestmark_loader
def test_batches_that_cost_more_than_a_task_should_stay_one_a_task(monkeypatch, no_leaks):
    monkeypatch.setattr(grouping_module, "TASK_SECONDS", 0.0)
    with Loader(paired_source(100), 4, workers=2, inline_when_faster=False) as loader:
        list(loader)
        assert loader.stats()["batches_per_task"] == 1 and loader.stats()["prefetch"] == 8


def test_the_rule_workers_auto_asks_follows_the_options():
    """What ``workers="auto"`` weighs a batch's cost by, before any pool exists (``auto.py``)."""
    assert grouping_module.per_task_rule(ExecutionOptions(workers=2), "stack")(0.0002) == grouping_module.MAX_BATCHES
    assert grouping_module.per_task_rule(ExecutionOptions(workers=2), "stack")(0.02) == 3  # 3 x 20 ms: 50 ms
    assert grouping_module.per_task_rule(ExecutionOptions(workers=2), "stack")(1.0) == 1
    assert grouping_module.per_task_rule(ExecutionOptions(workers=2, batches_per_task=3), "stack")(1.0) == 3
    assert grouping_module.per_task_rule(ExecutionOptions(workers=2), "pad")(0.0002) == 1
