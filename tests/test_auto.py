"""workers="auto" (execution/auto.py): the rules on scripted measurements, the probe's batches,
and a Loader that picks never changes what it delivers.

No test here depends on the machine's speed: the rules are fed synthetic probes, and the
loader tests script the measurement (``auto.measure``) to force each choice.
"""

import itertools
import math
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
from helpers import FaultySource, child_processes, epoch_digest, noisy, paired_source

from steadyfeed import Loader
from steadyfeed.config import ExecutionOptions, LoaderConfig
from steadyfeed.execution import auto, grouping

pytestmark = pytest.mark.timeout(120)

MB = 2**20
ALWAYS = lambda: None  # noqa: E731 - processes may be used


def probe(batch_ms=5.0, speedup=1.9, batch_bytes=MB):
    parallel = 2 * auto.THREAD_BATCHES * batch_ms / 1e3 / speedup
    return auto.Probe(batch_ms / 1e3, parallel, batch_bytes)


# -- the rules --------------------------------------------------------------------------------
def test_work_that_scales_on_threads_gets_a_thread_per_core():
    choice = auto.choose(probe(speedup=1.9), cores=4, budget=None, no_processes=ALWAYS)
    assert (choice.workers, choice.mode) == (4, "thread")
    assert "1.90x as fast as one: the work releases the GIL" in choice.reason
    assert choice.thread_speedup == pytest.approx(1.9) and choice.batch_bytes == MB


def test_gil_bound_work_gets_processes_unless_batches_are_cheaper_than_shipping_them():
    gil = auto.choose(probe(batch_ms=20, speedup=1.0), cores=2, budget=None, no_processes=ALWAYS)
    assert (gil.workers, gil.mode) == (2, "process") and "only 1.00x" in gil.reason
    cheap = auto.choose(probe(batch_ms=0.2, speedup=1.0), cores=2, budget=None, no_processes=ALWAYS)
    assert cheap.mode == "thread" and "less than shipping it from a process" in cheap.reason


def test_work_that_threads_scale_only_partly_gets_processes():
    """JPEG batches (2.5 ms, two threads 1.13-1.6x as fast as one in short probes) and npy
    pairs (0.6 ms, per-file Python) ran faster on processes, which lend their batches."""
    for speedup in (1.13, 1.45, 1.6):
        jpeg = auto.choose(probe(batch_ms=2.5, speedup=speedup), cores=2, budget=None, no_processes=ALWAYS)
        assert jpeg.mode == "process"
    npy = auto.choose(probe(batch_ms=0.6, speedup=1.0), cores=2, budget=None, no_processes=ALWAYS)
    assert npy.mode == "process"


def test_cheap_batches_that_share_a_task_are_worth_sending_from_a_process():
    """Page-cached HDF5 rows, 0.16 ms a batch: one a task costs less than sending it, eight do not."""
    hdf5 = probe(batch_ms=0.16, speedup=1.0)
    alone = auto.choose(hdf5, cores=2, budget=None, no_processes=ALWAYS)
    grouped = auto.choose(hdf5, cores=2, budget=None, no_processes=ALWAYS, per_task=grouping.batches_for)
    assert alone.mode == "thread" and "a batch takes 0.16 ms" in alone.reason
    assert grouped.mode == "process"
    tiny = auto.choose(probe(batch_ms=0.02, speedup=1.0), 2, None, ALWAYS, per_task=grouping.batches_for)
    assert tiny.mode == "thread" and "a task of 8 batches of 0.020 ms each takes 0.16 ms" in tiny.reason


def test_processes_are_asked_about_only_when_they_would_be_picked_and_a_refusal_keeps_threads():
    asked = []
    refuse = lambda: asked.append(1) or "the source does not pickle"  # noqa: E731
    auto.choose(probe(speedup=1.9), cores=2, budget=None, no_processes=refuse)
    assert asked == []  # threads won: nothing pickled
    choice = auto.choose(probe(batch_ms=20, speedup=1.0), cores=2, budget=None, no_processes=refuse)
    assert choice.mode == "thread" and "processes cannot be used: the source does not pickle" in choice.reason


def test_the_memory_budget_bounds_the_workers_by_their_queued_batches():
    # PREFETCH_PER_WORKER (4) batches of 10 MB each: 85 MB holds two workers' worth, not three
    choice = auto.choose(probe(batch_bytes=10 * MB), cores=8, budget=85 * MB, no_processes=ALWAYS)
    assert choice.workers == 2 and "4 queued batches of 10,485,760 bytes each fit" in choice.reason
    assert auto.choose(probe(batch_bytes=100 * MB), cores=8, budget=MB, no_processes=ALWAYS).workers == 1


def test_one_core_or_nothing_measured_gives_threads():
    assert auto.choose(probe(speedup=1.0, batch_ms=50), 1, None, ALWAYS).mode == "thread"
    nothing = auto.choose(auto.Probe(None, None, None), 2, None, ALWAYS)
    assert (nothing.workers, nothing.mode) == (2, "thread") and "too few batches" in nothing.reason


def test_a_cost_change_of_the_ratio_either_way_asks_for_a_new_measurement():
    assert not auto.cost_changed(0.010, 0.010 * (auto.RECHECK_RATIO - 0.5))
    assert auto.cost_changed(0.010, 0.010 * (auto.RECHECK_RATIO + 0.5))
    assert auto.cost_changed(0.010, 0.010 / (auto.RECHECK_RATIO + 0.5))
    assert not auto.cost_changed(0.010, None) and not auto.cost_changed(None, 0.010)


# -- the trial: cheap tasks on processes are timed against threads ------------------------------
HDF5_ROWS = probe(batch_ms=0.3, speedup=0.64)  # page-cached rows in order: 8 a task, 2.4 ms


def scripted_trial(rates):
    """A trial whose pool of ``mode`` workers times ``rates[mode]`` each time (None: never
    timed); records the pools started."""
    asked = []

    def trial(mode, workers):
        asked.append((mode, workers))  # at the first next(): the pool starts
        if rates[mode] is not None:
            yield from itertools.repeat(rates[mode])

    return trial, asked


def test_processes_picked_for_cheap_tasks_are_timed_against_threads_and_the_faster_is_kept():
    """HDF5 rows in order probed 0.64x on two threads, yet 2 threads made them 1.4-1.7x as
    fast as 2 processes: shipping a 2 ms task costs what the GIL takes."""
    trial, asked = scripted_trial({"thread": 9000.0, "process": 6000.0})
    threads = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert asked == [("thread", 2), ("process", 2)]  # threads first: they start in no time
    assert (threads.workers, threads.mode) == (2, "thread") and threads.trial == {"thread": 9000.0, "process": 6000.0}
    assert threads.trial_timings == {
        "thread": (9000.0,) * auto.TRIAL_TIMINGS,
        "process": (6000.0,) * auto.TRIAL_TIMINGS,
    }
    assert (
        "only 0.64x" in threads.reason and "2 thread(s) made 9,000 batches/s and 2 process(es) 6,000" in threads.reason
    )
    trial, _ = scripted_trial({"thread": 3000.0, "process": 7000.0})
    processes = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert processes.mode == "process" and processes.trial == {"thread": 3000.0, "process": 7000.0}
    assert "; timed warm on the epoch's first half" in processes.reason


@pytest.mark.parametrize(
    "thread_rate, process_rate, kept",
    [
        (16_107.0, 15_988.0, "process"),
        (15_160.0, 13_075.0, "process"),
        (1.2 * 13_000, 13_000.0, "process"),
        (1.3 * 13_000, 13_000.0, "thread"),
    ],
)
def test_threads_that_merely_lead_in_the_trial_leave_the_batches_to_processes(thread_rate, process_rate, kept):
    """The trial's consumer does nothing between batches; a program's holds the GIL some of that
    time, which only thread workers wait for. Page-cached HDF5 rows in order: threads timed
    level with processes (16.1k against 16.0k batches/s), then gave a consumer checking each
    batch 0.62x what processes gave it."""
    trial, _ = scripted_trial({"thread": thread_rate, "process": process_rate})
    choice = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert choice.mode == kept and choice.trial == {"thread": thread_rate, "process": process_rate}


def test_the_pools_are_timed_in_turn_and_each_counts_its_fastest_timing():
    """One fresh-clone run timed 2 processes at 375 batches/s (2,272-3,447 in every other run)
    against 2 threads' 1,590 and kept threads, 0.54x of processes: one slow stretch decided."""
    timings = {"thread": (1590.0, 1610.0, 1600.0), "process": (375.0, 2900.0, 3100.0)}
    events = []

    def trial(mode, workers):
        try:
            for rate in timings[mode]:
                events.append(mode)
                yield rate
        finally:
            events.append(f"{mode} shut down")

    choice = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert events == ["thread", "process"] * auto.TRIAL_TIMINGS + ["thread shut down", "process shut down"]
    assert choice.mode == "process" and choice.trial == {"thread": 1610.0, "process": 3100.0}
    assert choice.trial_timings == timings
    assert "(3 times each, in turn; the fastest), 2 thread(s) made 1,610 batches/s" in choice.reason


def test_a_pool_whose_timings_stop_ends_the_trial_and_both_pools_are_shut_down():
    events = []

    def trial(mode, workers):
        try:
            yield 1000.0
            if mode == "thread":
                yield 1000.0  # the processes' second timing meets a failing sample
        finally:
            events.append(f"{mode} shut down")

    choice = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert choice.mode == "process" and choice.trial is None and choice.trial_timings is None
    assert sorted(events) == ["process shut down", "thread shut down"]


def test_the_trial_times_the_workers_the_memory_budget_allows():
    trial, asked = scripted_trial({"thread": 2.0, "process": 1.0})
    choice = auto.choose(
        probe(batch_ms=0.3, speedup=0.64, batch_bytes=10 * MB), 8, 85 * MB, ALWAYS, grouping.batches_for, trial
    )
    assert asked == [("thread", 2), ("process", 2)] and (choice.workers, choice.mode) == (2, "thread")
    assert "2 worker(s): 4 queued batches" in choice.reason


@pytest.mark.parametrize(
    "measured, no_processes",
    [
        (probe(batch_ms=6.0, speedup=1.1), ALWAYS),  # JPEG: 8 a task, 48 ms: shipping is nothing beside it
        (probe(batch_ms=0.3, speedup=1.9), ALWAYS),  # threads scale: picked without a trial
        (probe(batch_ms=0.02, speedup=1.0), ALWAYS),  # cheaper than shipping: threads without a trial
        (HDF5_ROWS, lambda: "the source does not pickle"),
    ],
    ids=["costly-tasks", "threads-scale", "tiny-tasks", "no-processes"],
)
def test_only_processes_picked_for_cheap_tasks_are_timed(measured, no_processes):
    trial, asked = scripted_trial({"thread": 1.0, "process": 2.0})
    choice = auto.choose(measured, 2, None, no_processes, grouping.batches_for, trial)
    assert asked == [] and choice.trial is None and "timed" not in choice.reason


@pytest.mark.parametrize("rates", [{"thread": None, "process": 2.0}, {"thread": 2.0, "process": None}])
def test_a_pool_that_could_not_be_timed_leaves_the_rules_pick(rates):
    trial, asked = scripted_trial(rates)
    choice = auto.choose(HDF5_ROWS, 2, None, ALWAYS, grouping.batches_for, trial)
    assert choice.mode == "process" and choice.trial is None and "timed" not in choice.reason
    assert asked == ([("thread", 2)] if rates["thread"] is None else [("thread", 2), ("process", 2)])


def batch_outcome(failed=False):
    return types.SimpleNamespace(failures=["a failure"] if failed else [], disagreement=None, arrays={"x": 1})


TICK = 2**-10  # a binary fraction: the scripted times add up exactly, whatever TRIAL_SECONDS is


class Clock:
    """A tick a reading."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += TICK
        return self.now


class Passes:
    """A pool's runs over one stretch of batches, ``length`` each (a failure at ``fail_at``, a
    (pass, batch) pair): records the batches taken and the passes ended. Each run is kept, as
    the loader's runs are (a run left open would go on making batches)."""

    def __init__(self, length, fail_at=None, passes=None):
        self.length, self.fail_at, self.passes = length, fail_at, passes
        self.taken = []  # (pass, batch)
        self.runs, self.ended = [], []  # every run made; the passes taken whole or closed

    def __iter__(self):
        number = itertools.count() if self.passes is None else range(self.passes)
        return (self._kept(self._run(p)) for p in number)

    def _kept(self, run):
        self.runs.append(run)
        return run

    def _run(self, p):
        try:
            for k in range(self.length):
                self.taken.append((p, k))
                yield batch_outcome(failed=(p, k) == self.fail_at)
        finally:
            self.ended.append(p)


def test_paces_warm_up_on_a_whole_pass_then_time_from_a_pass_start_for_its_seconds():
    runs = Passes(length=100)
    steady = lambda: len(runs.taken) > 10  # noqa: E731 - the first 10 batches came while grouping learnt
    timer = auto.paces(iter(runs), steady, Clock())
    assert next(timer) == pytest.approx(1 / TICK)  # a batch a (scripted) tick
    timed = math.ceil(auto.TRIAL_SECONDS / TICK)
    assert len(runs.taken) == 100 + timed  # the warm-up pass whole, then the timed batches, and no further
    passes = math.ceil(timed / 100)
    assert sorted({p for p, _ in runs.taken[100:]}) == list(range(1, 1 + passes))
    assert runs.ended == list(range(1 + passes))  # its last pass closed: no batches made between timings
    assert next(timer) == pytest.approx(1 / TICK)  # the next timing: a pass of its own, alike
    assert runs.taken[100 + timed :] == [(1 + passes + p, k) for p in range(passes) for k in range(100)][:timed]


def test_paces_cut_a_long_warm_up_pass_at_its_seconds_once_steady():
    runs = Passes(length=10_000)
    steady = lambda: len(runs.taken) > 10  # noqa: E731
    assert next(auto.paces(iter(runs), steady, Clock())) == pytest.approx(1 / TICK)
    warm = [k for p, k in runs.taken if p == 0]
    assert len(warm) == 11 + math.ceil(auto.TRIAL_SECONDS / TICK)  # steady from the 11th, then its seconds
    assert runs.taken[len(warm)] == (1, 0)  # timed from the next pass's start


@pytest.mark.parametrize(
    "runs, steady",
    [
        (Passes(length=100, fail_at=(0, 50)), lambda: True),  # a failure while warming up
        (Passes(length=100, fail_at=(2, 7)), lambda: True),  # a failure while timed
        (Passes(length=100), lambda: False),  # never steady: a worker never started
        (Passes(length=10, passes=3), lambda: True),  # the passes ran out before the seconds
    ],
    ids=["failed-warming", "failed-timed", "never-steady", "too-few"],
)
def test_paces_time_nothing_where_a_batch_fails_or_the_pool_never_settles(runs, steady):
    assert list(auto.paces(iter(runs), steady, Clock())) == []


# -- the probe ---------------------------------------------------------------------------------
def test_the_probe_warms_up_times_batches_one_by_one_then_makes_pairs_in_two_threads():
    made = []

    def make(k):
        made.append((k, threading.current_thread()))  # the object, kept: idents are reused
        return 1000 + k

    result = auto.measure(make, batches=100)
    ks = [k for k, _ in made]
    assert ks[: 1 + auto.TIMED_BATCHES] == list(range(1 + auto.TIMED_BATCHES))
    assert sorted(ks) == list(range(1 + auto.TIMED_BATCHES + 2 * auto.THREAD_BATCHES))
    paired = [t for k, t in made if k > auto.TIMED_BATCHES]
    assert threading.current_thread() not in paired and len(set(paired)) == 2  # two threads
    assert sorted(paired.count(t) for t in set(paired)) == [auto.THREAD_BATCHES] * 2  # an even share
    assert result.parallel_seconds is not None
    assert result.batch_bytes == 1000 and result.batch_seconds is not None


@pytest.mark.parametrize("fail_at", [0, 1, 1 + auto.TIMED_BATCHES])
def test_a_failing_batch_or_too_few_batches_measure_nothing_and_raise_nothing(fail_at):
    def make(k):
        if k == fail_at:
            raise ValueError("a bad sample")
        return 1

    failed = auto.measure(make, batches=100)
    assert failed.thread_speedup is None
    assert auto.measure(lambda k: 1, batches=1 + auto.TIMED_BATCHES).thread_speedup is None


# -- the option ---------------------------------------------------------------------------------
def test_workers_auto_and_unset_are_options_and_ray_must_count_its_actors():
    assert ExecutionOptions(workers="auto").workers == "auto"
    assert ExecutionOptions().workers is None and ExecutionOptions().resolved().workers == 0
    assert ExecutionOptions().resolved("auto").workers == "auto"
    assert ExecutionOptions(mode="ray").resolved("auto").workers == 0
    with pytest.raises(ValueError, match="workers must be an int >= 0, 'auto' or None"):
        ExecutionOptions(workers="many")
    with pytest.raises(ValueError, match="give Ray a number of actors"):
        ExecutionOptions(workers="auto", mode="ray")
    LoaderConfig.build(batch_size=2, workers="auto", timeout=5)  # auto always has workers to interrupt
    with pytest.raises(ValueError, match="timeout needs workers"):
        LoaderConfig.build(batch_size=2, timeout=5)


def scripted(monkeypatch, *probes):
    """``auto.measure`` returns these probes in turn; records the batch counts it was asked about."""
    asked, queue = [], list(probes)

    def measure(make, batches):
        asked.append(batches)
        make(0)  # the real probe makes batches: they must not disturb the epoch
        return queue.pop(0)

    monkeypatch.setattr(auto, "measure", measure)
    return asked


GIL = probe(batch_ms=20, speedup=1.0)
SCALES = probe(batch_ms=20, speedup=1.9)


@pytest.mark.parametrize("measured", [GIL, SCALES])
def test_a_loader_that_picks_delivers_the_batches_of_workers_0(monkeypatch, measured, no_leaks):
    scripted(monkeypatch, measured)
    src = paired_source(60)
    options = dict(shuffle=True, seed=5, transform=noisy, with_ids=True)
    with Loader(src, 8, **options) as plain:
        expected = epoch_digest(plain.epoch(0))
    with Loader(src, 8, workers="auto", **options) as loader:
        assert loader.stats()["auto"] is None  # not measured before an epoch starts
        assert epoch_digest(loader.epoch(0)) == expected
        stats = loader.stats()
    mode = "process" if measured is GIL else "thread"
    assert (stats["workers"], stats["mode"]) == (auto.usable_cores(), mode)
    assert stats["auto"]["mode"] == mode and stats["auto"]["reason"]
    assert f"picked {auto.usable_cores()} {mode}" in repr(loader)


def test_a_loader_measures_again_when_batches_change_cost_and_restarts_its_workers(monkeypatch, no_leaks):
    asked = scripted(monkeypatch, SCALES, GIL)
    monkeypatch.setattr(auto, "cost_changed", lambda reference, now: True)
    src = paired_source(80)
    with Loader(src, 4, seed=1, transform=noisy) as plain:
        expected = [epoch_digest(plain.epoch(e)) for e in range(3)]
    with Loader(src, 4, seed=1, transform=noisy, workers="auto") as loader:
        digests = [epoch_digest(loader.epoch(0))]
        digests.append(epoch_digest(loader.epoch(1)))  # epoch 0's cost becomes the reference
        assert loader.stats()["mode"] == "thread" and asked == [20]
        digests.append(epoch_digest(loader.epoch(2)))  # epoch 1's cost "changed": measured again
        assert loader.stats()["mode"] == "process"
    assert digests == expected and asked == [20, 20]


@pytest.mark.parametrize(
    "options, mode",
    [({}, "process"), ({"batches_per_task": 1}, "thread"), ({"collate": "pad"}, "thread")],
    ids=["grouped", "one-a-task", "padded"],
)
def test_a_loader_weighs_cheap_batches_by_the_tasks_they_would_share(monkeypatch, options, mode, no_leaks):
    scripted(monkeypatch, probe(batch_ms=0.16, speedup=1.0))
    with Loader(paired_source(40), 4, workers="auto", **options) as loader:
        assert sum(len(b["x"]) for b in loader) == 40
        assert loader.stats()["auto"]["mode"] == mode
        assert loader.stats()["auto"]["trial"] is None  # 10 batches: too few to time two pools on


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_ctrl_c_while_a_trial_pool_stops_leaves_no_worker_once_the_epoch_has_ended(mode, monkeypatch, no_leaks):
    """A user pressing Ctrl-C in a fit's first seconds lands in the trial: here twice inside the
    shutdown of one of its pools (the wait for a worker, then the kill of the rest). The other
    pool still stops, the epoch's own shutdown finishes the first, and the Ctrl-C leaves the
    loader with no process worker of either left (checked while its traceback, which holds the
    trial's generators, is still alive: the garbage collector would have closed them later)."""
    from steadyfeed.execution.workers import ProcessWorker, ThreadWorker

    kind = ThreadWorker if mode == "thread" else ProcessWorker
    scripted(monkeypatch, HDF5_ROWS)
    real_stop, real_abandon = kind.stop, kind.abandon

    def third_ctrl_c(self):
        monkeypatch.setattr(kind, "abandon", real_abandon)
        raise KeyboardInterrupt("third")

    def second_ctrl_c(self):
        monkeypatch.setattr(kind, "stop", real_stop)
        monkeypatch.setattr(kind, "abandon", third_ctrl_c)
        raise KeyboardInterrupt("second")

    monkeypatch.setattr(kind, "stop", second_ctrl_c)
    loader = Loader(paired_source(800), 4, workers="auto")
    with pytest.raises(KeyboardInterrupt, match="third") as info:
        list(loader)
    assert kind.stop is real_stop and kind.abandon is real_abandon  # both pressed
    assert child_processes() == [] and info.value is not None
    loader.close()


def test_a_loader_times_both_pools_for_cheap_tasks_and_delivers_the_batches_of_workers_0(monkeypatch, no_leaks):
    """Real pools, timed on real batches: which wins is the machine's business, so the test
    asserts that both were timed, that the pick is the faster (threads by the trial's margin),
    and that nothing else changed."""
    scripted(monkeypatch, HDF5_ROWS)
    firsts, pools, real_paces = [], [], auto.paces  # each pool's passes: the first batch of each

    def paces(passes, steady):
        pool, starts = len(firsts), []  # threads are 0, processes 1
        firsts.append(starts)

        def watched(run):
            for k, outcome in enumerate(run):
                if k == 0:
                    starts.append(outcome.spec.index)
                    pools.append(pool)
                yield outcome

        yield from real_paces((watched(run) for run in passes), steady)

    monkeypatch.setattr(auto, "paces", paces)
    runs, real_run = [], Loader._epoch_run  # each run's plan: its batches and where it starts

    def epoch_run(self, pool, handoff, plan, epoch, start, *rest, **options):
        runs.append((len(plan), start))
        return real_run(self, pool, handoff, plan, epoch, start, *rest, **options)

    monkeypatch.setattr(Loader, "_epoch_run", epoch_run)
    src = paired_source(800)  # 200 batches: a half enough to learn a task's size and time
    options = dict(shuffle=True, seed=3, transform=noisy, with_ids=True)
    with Loader(src, 4, **options) as plain:
        expected = [epoch_digest(plain.epoch(e)) for e in range(2)]
    with Loader(src, 4, workers="auto", **options) as loader:
        assert [epoch_digest(loader.epoch(e)) for e in range(2)] == expected
        picked, stats = loader.stats()["auto"], loader.stats()
    # both pools on the first half: warmed up on it, then timed on it again; a run's plan ends
    # there (its window would send workers batches past it, which no run takes)
    assert [set(starts) for starts in firsts] == [{0}, {0}] and min(map(len, firsts)) >= 1 + auto.TRIAL_TIMINGS
    # timed in turn, threads first: each stretch of one pool's passes a timing (the first after its warm-up)
    assert [pool for pool, _ in itertools.groupby(pools)] == [0, 1] * auto.TRIAL_TIMINGS
    trial_runs = [run for run in runs if run[0] != 200]  # the epochs' and the probe's plans hold all 200
    assert trial_runs == [(100, 0)] * sum(map(len, firsts))
    rates = picked["trial"]
    assert set(rates) == {"thread", "process"} and min(rates.values()) > 0
    assert {pool: max(timings) for pool, timings in picked["trial_timings"].items()} == rates
    threads_kept = rates["thread"] >= auto.TRIAL_THREAD_MARGIN * rates["process"]  # by the trial's margin
    assert picked["mode"] == ("thread" if threads_kept else "process") == stats["mode"]
    assert (
        "timed warm on the epoch's first half" in picked["reason"] and stats["batches"] == 400
    )  # the trial's batches are not counted


def test_a_failing_sample_ends_the_trial_and_is_met_once_by_the_epoch(monkeypatch, tmp_path, no_leaks):
    scripted(monkeypatch, HDF5_ROWS)
    src = FaultySource(800, fail=[5], marker_dir=str(tmp_path))
    with Loader(src, 4, workers="auto", on_error="skip", with_ids=True) as loader:
        ids = np.concatenate([b["id"] for b in loader.epoch(0)])
        picked, report = loader.stats()["auto"], loader.quarantine_report()
    assert sorted(ids.tolist()) == [i for i in range(800) if i != 5]
    assert picked["mode"] == "process" and picked["trial"] is None  # the rule's pick stands
    assert [entry["sample_id"] for entry in report] == [5]


def test_unset_workers_are_0_when_iterated_and_auto_under_keras(monkeypatch):
    pytest.importorskip("keras", reason="keras is not installed", exc_type=ImportError)
    scripted(monkeypatch, SCALES)
    with Loader(paired_source(24), 4) as loader:
        list(loader)
        assert loader.stats()["workers"] == 0 and "auto" not in loader.stats()
    with Loader(paired_source(24), 4) as loader:
        dataset = loader.as_keras()
        assert sum(len(x) for x, _ in dataset) == 24
        dataset.close()
        assert loader.stats()["auto"]["mode"] == "thread" and loader.stats()["workers"] == auto.usable_cores()
    with Loader(paired_source(24), 4, workers=0) as loader:  # given: kept
        dataset = loader.as_keras()
        list(dataset)
        dataset.close()
        assert loader.stats()["workers"] == 0


class ThreadsOnly:
    """A source that refuses process workers, as a Ray Data source does (its rows live in Ray)."""

    def __init__(self, n):
        self.inner = paired_source(n)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]

    def unsupported(self, mode, workers):
        return "rows in another process's memory" if mode == "process" and workers > 0 else None


def test_gil_bound_work_on_a_source_that_refuses_processes_stays_on_threads(monkeypatch, no_leaks):
    scripted(monkeypatch, GIL)
    with Loader(ThreadsOnly(24), 4, workers="auto") as loader:  # "auto" is no refusal by itself
        assert sum(len(b["x"]) for b in loader) == 24
        picked = loader.stats()["auto"]
    assert picked["mode"] == "thread" and "rows in another process's memory" in picked["reason"]


def test_the_memory_budget_is_the_options_or_a_share_of_what_is_available():
    assert auto.memory_budget(123) == 123
    available = auto.available_memory()
    assert auto.memory_budget(None) == (None if available is None else available // auto.MEMORY_SHARE)
    assert available is None or available > 0


class Slows:
    """Rows of ``paired_source`` that sleep 2 ms each, 50 ms once ``slow`` is set: sleeps are
    lower bounds on any machine, so the cheap epochs' cost cannot fall to nothing (microsecond
    batches vary many-fold on a busy machine) and the slow ones cost 25x at least."""

    def __init__(self, n):
        self.inner, self.slow = paired_source(n), False

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(0.05 if self.slow else 0.002)
        return self.inner[i]


def test_batches_that_become_far_costlier_make_the_next_epoch_measure_again(monkeypatch, no_leaks):
    asked = scripted(monkeypatch, SCALES, SCALES)
    monkeypatch.setattr(auto, "RECHECK_RATIO", 10.0)  # far above what noise makes of 2 ms sleeps
    src = Slows(80)
    with Loader(src, 4, workers="auto") as loader:
        list(loader.epoch(0))
        list(loader.epoch(1))  # epoch 0 is the reference
        list(loader.epoch(2))  # as costly as epoch 0: nothing measured
        assert asked == [20]
        src.slow = True
        list(loader.epoch(3))
        list(loader.epoch(4))  # epoch 3 cost 25x the reference or more
    assert asked == [20, 20]


# -- the program's main module: spawned workers must be able to start -------------------------
def fake_main(monkeypatch, tmp_path, script: str | None):
    """``sys.modules["__main__"]`` as a script holding ``script`` (None: an interactive session)."""
    main = types.ModuleType("__main__")
    if script is not None:
        main.__file__ = str(tmp_path / "train.py")
        (tmp_path / "train.py").write_text(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return main


@pytest.mark.parametrize(
    "script, refused",
    [
        ("import steadyfeed\nif __name__ == '__main__':\n    run()\n", False),
        ('if "__main__" == __name__: run()\n', False),
        ("import steadyfeed\nrun()  # no guard\n", True),
    ],
    ids=["guarded", "guarded-reversed", "unguarded"],
)
def test_a_main_script_without_a_guard_keeps_auto_on_threads(monkeypatch, tmp_path, script, refused):
    fake_main(monkeypatch, tmp_path, script)
    why = auto.can_use_processes(paired_source(4), lambda mode: None)
    assert (why is not None) == refused
    if refused:
        assert "train.py has no 'if __name__ == \"__main__\":' guard" in why


def test_a_transform_from_an_interactive_session_keeps_auto_on_threads(monkeypatch, tmp_path):
    main = fake_main(monkeypatch, tmp_path, None)
    assert auto.can_use_processes(paired_source(4), lambda mode: None) is None  # nothing of __main__ held

    def brighten(sample, rng):
        return sample

    brighten.__module__, brighten.__qualname__ = "__main__", "brighten"
    main.brighten = brighten
    why = auto.can_use_processes({"transform": brighten}, lambda mode: None)
    assert why == "brighten is defined in an interactive session's __main__, which spawned workers cannot import"


SCRIPT = """
import sys
import numpy as np
import steadyfeed
from steadyfeed.execution import auto

auto.measure = lambda make, batches: auto.Probe(0.02, 2 * auto.THREAD_BATCHES * 0.02, 64)  # GIL-bound

def main():
    x = np.arange(64, dtype=np.float64).reshape(16, 4)
    with steadyfeed.Loader(steadyfeed.ArraySource(x=x), 4, workers="auto") as loader:
        assert sum(len(b["x"]) for b in loader) == 16
        print("picked", loader.stats()["auto"]["mode"], flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_auto_in_a_real_script_starts_processes_only_where_the_script_lets_them(tmp_path, guarded):
    """A script run as users run them: with the guard, "auto" picks processes for GIL-bound
    batches and they start; without it, threads, where processes would have run the script
    again in each worker and failed."""
    body = SCRIPT + ('if __name__ == "__main__":\n    main()\n' if guarded else "main()\n")
    (tmp_path / "train.py").write_text(body)
    done = subprocess.run([sys.executable, str(tmp_path / "train.py")], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["picked process" if guarded else "picked thread"]
