"""``workers="auto"``: how many workers, and which kind, measured on the loader's own batches.

At the start of the first epoch (and of a later one, when the batches' cost has changed
``RECHECK_RATIO``-fold since the first stretch after the pick, see :func:`cost_changed`), the loader makes a few batches of
that epoch in the consumer (``Loader.peek``: exactly the batches iteration gives), then a
few more in two threads at once, and picks:

* **how many**: the usable cores (``os.sched_getaffinity``), at most as many as the
  prefetch queue's batches (``PREFETCH_PER_WORKER``) fit in a memory budget: ``max_inflight_bytes``
  when given, else a quarter of the memory available now;
* **the mode**: ``"thread"`` when two threads made batches at least ``THREADS_SCALE``
  times as fast as one did one after the other (the work releases the GIL: decoders, file
  reads, numpy), or when a task costs less than ``PROCESS_WORTH_SECONDS`` (less than
  sending it from a process costs; the consumer may then make batches itself,
  ``handoff.py``). A task holds as many batches as ``batches_per_task`` would put in one
  (``grouping.py``: 8 batches of a page-cached HDF5 file's rows, 0.16 ms each, make a task
  worth sending). Otherwise ``"process"`` (the work holds the GIL, or scales on threads only
  partly), unless the source cannot go to a process (it does not pickle, it says so
  through ``unsupported``, or the program's main module would not let spawned workers
  start: a script without an ``if __name__ == "__main__":`` guard, or a transform defined
  in a notebook, see :func:`main_module_problem`).

  Where that rule picks processes for tasks that cost less than ``TRIAL_TASK_SECONDS``, both
  pools are **timed** (``trial``) on the first half of the epoch's batches, threads first,
  handed out as iteration hands them. Each pool makes the half once to warm up (its workers
  started, its tasks' size learnt, a process worker's shared-memory slots made: a task of 32
  batches of npy pairs writes 50 MB of fresh pages, which about doubled the first tasks' time;
  timed from there, 2 processes made 1.0-1.8x what 2 threads did, against 1.65-1.75x in the
  epochs that followed), then is timed over it again, ``TRIAL_TIMINGS`` times for
  ``TRIAL_SECONDS`` each, in turn with the other pool (:func:`paces`; both pools live through
  the trial, the idle one waiting), and the faster is kept, by each pool's fastest timing (a
  stall of the machine slows a timing, nothing speeds one up), threads only where they were
  ``TRIAL_THREAD_MARGIN`` times faster: the trial's consumer does nothing between batches, a
  program's holds the GIL some of that time, which slows thread workers and not processes.
  Both are timed on data they read once already, however much of it the page cache holds:
  timed on the second half, where the page cache held only the first, 2 processes made 112
  batches/s against 2 threads' 829 on the first. For such tasks, what shipping one from a
  process costs is of the order of what threads lose to the GIL or win by overlap (a worker's
  read beside the consumer's own work), and the probe sees only the GIL: page-cached HDF5 rows
  in order (2.3 ms a task of 8 batches) probed 0.64x on two threads, and once made 2 threads
  1.4-1.7x as fast as 2 processes; the trial weighs both. Costlier tasks (JPEG: 8 batches,
  ~30 ms) are not timed.

The probe's and the trial's batches are made and dropped: they cost a few batches of time,
once (a trial: each pool's warm-up half and ``TRIAL_TIMINGS`` times ``TRIAL_SECONDS``, and one
more start of process workers; an epoch too short to time two pools on keeps the rule's pick).
Which workers make a batch never changes what it holds, so the choice shows only in speed and
in ``Loader.stats()["auto"]`` (the choice, the measurements, and why). A probe that fails (a
sample raises) stops there and picks threads, a trial that meets one times nothing and leaves
the rule's pick; the epoch then meets the failure as it would have anyway, under the loader's
``on_error``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass

from ..config import PREFETCH_PER_WORKER, Mode

# trial(mode, workers): a pool of that many such workers, timed at each next() (see paces);
# closing it shuts the pool down
Trial = Callable[[Mode, int], Generator[float, None, None]]

# of the 2x two threads could give: GIL-bound work gives about 1x (or less); JPEG batches gave
# 1.13x-1.59x in short probes on the 2-core VM. Since process workers lend their batches (no
# copy) and the consumer's thread talks to them directly (no thread hop), processes are as fast
# as threads or faster on JPEG (19.5k against 16.1k images/s) and npy pairs (65k against 49k),
# whose per-file Python holds the GIL: threads only when they scale nearly as two cores do. A
# JPEG probe once measured 1.6x, and its 2 threads then ran at 0.89x of 2 processes (18.4k
# against 20.7k images/s): processes unless threads come close to 2x
THREADS_SCALE = 1.8
# a task cheaper than this costs less to make than to ship from a process (~0.2 ms of CPU a
# task, the consumer's and the worker's together; a batch of 32 page-cached HDF5 rows costs
# 0.16 ms, in order, and 8 of them in one task ran at 1.4x workers=0 on 2 processes)
PROCESS_WORTH_SECONDS = 0.0004
MEMORY_SHARE = 4  # without max_inflight_bytes, queued batches may take 1/4 of the memory available
RECHECK_RATIO = 4.0  # a batch cost this many times higher or lower than measured: measure again
MIN_BATCHES_FOR_RECHECK = 16  # batches made since the choice before their cost is compared with it
TIMED_BATCHES = 3  # made one after the other, after one that is not timed (files opened, caches warmed)
# then made by two threads at once, this many each, one after the other: a single batch each would
# time mostly the second thread's start (measured: 1.1-1.2x for JPEG batches that 2 threads make 1.5x as fast)
THREAD_BATCHES = 4
MAIN_SCRIPT_BYTES = 1 << 20  # of the main script read for its guard
# processes picked for tasks cheaper than this: time both pools (see the module docstring).
# Shipping a task costs ~0.2-0.5 ms: under 1% of a JPEG task (~50 ms), 5-20% of one of HDF5
# rows (2-4 ms) or npy pairs (6 ms), about what threads lose to the GIL or win by overlap
TRIAL_TASK_SECONDS = 0.02
TRIAL_SECONDS = 0.25  # a timing lasts at least this long, after the pool's warm-up half
TRIAL_MIN_BATCHES = 32  # and holds at least this many batches
# timings of each pool, in turn with the other's: one fresh-clone run timed 2 processes at 375
# batches/s (2,272-3,447 in every other run, 2 threads 1,590) and kept threads, at 0.54x
TRIAL_TIMINGS = 3
# threads are kept only where the trial timed them this many times faster than processes. The
# trial's consumer takes its batches and does nothing else; a program's consumer runs Python
# between batches (its step's dispatch, callbacks, its own checks), holding the GIL that thread
# workers need and process workers do not. Page-cached HDF5 rows in order (h5py's own lock
# serialises the threads' reads): the trial timed 2 threads level with 2 processes (16.1k
# against 16.0k batches/s; 15.2k against 13.1k), where a consumer that checked each batch (8 us
# of numpy) then got 1.20-1.25x as many batches from the processes, and 0.62x from the threads kept
TRIAL_THREAD_MARGIN = 1.25


@dataclass(frozen=True)
class AutoChoice:
    """What ``workers="auto"`` picked, from what it measured, and why (``stats()["auto"]``)."""

    workers: int
    mode: Mode
    reason: str
    cores: int
    batch_seconds: float | None  # one batch made in the consumer (median of the timed ones)
    thread_speedup: float | None  # two batches in two threads, against one after the other
    batch_bytes: int | None
    trial: dict[str, float] | None = None  # batches a second each pool made, where they were timed: its fastest timing
    trial_timings: dict[str, tuple[float, ...]] | None = None  # every timing, in the order taken

    def as_dict(self) -> dict:
        return asdict(self)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and ``taskset`` set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_budget(max_inflight_bytes: int | None) -> int | None:
    """Bytes the queued batches may take: ``max_inflight_bytes``, else ``1 / MEMORY_SHARE`` of the
    memory available now (None where that is unknown: no bound but the cores)."""
    if max_inflight_bytes is not None:
        return max_inflight_bytes
    available = available_memory()
    return None if available is None else available // MEMORY_SHARE


@dataclass(frozen=True)
class Probe:
    """The measurements: seconds per batch made one after the other, the wall time of
    ``2 * THREAD_BATCHES`` made by two threads at once, and a batch's bytes; None where the
    probe could not get that far."""

    batch_seconds: float | None
    parallel_seconds: float | None
    batch_bytes: int | None

    @property
    def thread_speedup(self) -> float | None:
        if self.batch_seconds is None or not self.parallel_seconds:
            return None
        return 2 * THREAD_BATCHES * self.batch_seconds / self.parallel_seconds


def measure(make: Callable[[int], int], batches: int) -> Probe:
    """``make(k)`` makes batch ``k`` in the calling thread and returns its bytes. Batch 0 warms
    up, the next ``TIMED_BATCHES`` are timed one after the other (their median is a batch's
    cost), then two threads make ``THREAD_BATCHES`` each at once."""
    needed = 1 + TIMED_BATCHES + 2 * THREAD_BATCHES
    if batches < needed:
        return Probe(None, None, None)
    try:
        batch_bytes = make(0)
        seconds = []
        for k in range(1, 1 + TIMED_BATCHES):
            t0 = time.perf_counter()
            make(k)
            seconds.append(time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 - the epoch meets it again, under the loader's on_error
        return Probe(None, None, None)
    # the median: one batch slowed by a cold file or a page cache still filling would make two
    # threads look like they scale (npy pairs: 1.77x, for work that holds the GIL)
    return Probe(statistics.median(seconds), _in_two_threads(make, 1 + TIMED_BATCHES), batch_bytes)


def _in_two_threads(make: Callable[[int], int], first: int) -> float | None:
    """Wall seconds for ``2 * THREAD_BATCHES`` batches from ``first`` on, made by two threads
    at once, ``THREAD_BATCHES`` each."""
    failed = []

    def run(ks: range) -> None:
        try:
            for k in ks:
                make(k)
        except Exception:  # noqa: BLE001 - reported as "no measurement"
            failed.append(ks)

    halves = (range(first, first + THREAD_BATCHES), range(first + THREAD_BATCHES, first + 2 * THREAD_BATCHES))
    threads = [threading.Thread(target=run, args=(ks,), name="steadyfeed-auto-probe") for ks in halves]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return None if failed else time.perf_counter() - t0


def paces(
    passes: Iterator[Iterable], steady: Callable[[], bool], clock: Callable[[], float] = time.perf_counter
) -> Iterator[float]:
    """Batches a second a pool makes once warm, one timing at each ``next()``. ``passes``: its
    runs over the same stretch of an epoch's batches, again and again (each an iterable of
    outcomes, in the order handed out). The first warms up: taken to its end, or
    ``TRIAL_SECONDS`` after ``steady()`` first holds (the pool's tasks have their size and every
    worker has started: a spawned worker that imports a framework with the main script takes
    seconds, while the other makes every batch). Each timing then starts a pass of its own
    and times it from its start, into the passes after where it is short, until
    ``TRIAL_MIN_BATCHES`` and ``TRIAL_SECONDS`` have both passed: every timing is made alike.
    Ends where a batch failed, the pool never became steady, or the passes ran out. The
    caller stops the runs (closes ``passes``)."""
    if not _warm_up(next(passes, ()), steady, clock):
        return
    while True:
        rate = _timing(passes, clock)
        if rate is None:
            return
        yield rate


def _timing(passes: Iterator[Iterable], clock: Callable[[], float]) -> float | None:
    """One timing (see :func:`paces`): batches a second from the next pass's start."""
    start, timed = clock(), 0
    for run in passes:
        for outcome in run:
            if _failed(outcome):
                return None  # the epoch meets it again, under the loader's on_error
            now, timed = clock(), timed + 1
            if timed >= TRIAL_MIN_BATCHES and now - start >= TRIAL_SECONDS:
                _close(run)  # the next timing starts a pass of its own
                return timed / (now - start)
    return None


def _close(run: Iterable) -> None:
    close = getattr(run, "close", None)
    if close is not None:
        close()


def _warm_up(outcomes: Iterable, steady: Callable[[], bool], clock: Callable[[], float]) -> bool:
    """Takes a warm-up pass (see :func:`paces`); whether the pool is steady and nothing failed."""
    since = None
    for outcome in outcomes:
        if _failed(outcome):
            return False
        if since is None and steady():
            since = clock()
        elif since is not None and clock() - since >= TRIAL_SECONDS:
            break
    return steady()


def _failed(outcome) -> bool:
    return bool(outcome.failures) or outcome.disagreement is not None or outcome.arrays is None


def can_use_processes(ctx, unsupported: Callable[[Mode], str | None]) -> str | None:
    """Why process workers cannot read this source (None: they can): the source (or a layer
    of it) refuses them, the work context does not pickle (spawned workers receive it), or
    the program's main module would not let them start (:func:`main_module_problem`)."""
    why = unsupported("process")
    if why:
        return why
    pickler = _MainReferences(io.BytesIO())
    try:
        pickler.dump(ctx)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises, processes are out
        return f"the source or transform does not pickle ({type(exc).__name__}: {exc})"
    return main_module_problem(pickler.found)


class _MainReferences(pickle.Pickler):
    """Pickles, and notes the first class or function of ``__main__`` the pickle names."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.found: str | None = None

    def persistent_id(self, obj):
        if self.found is None and isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            self.found = obj.__qualname__
        return None  # pickled as usual


# what guards a script's entry point: if __name__ == "__main__": (either way round, either quotes)
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


def main_module_problem(main_reference: str | None) -> str | None:
    """Why spawned workers could not start under this program's ``__main__`` (None: they can).

    A spawned worker imports the main script again before it runs anything: a script without
    an ``if __name__ == "__main__":`` guard would run again in each worker, training included,
    until it starts workers of its own and fails. Without a main script (an interactive
    session, a notebook), a worker cannot import what ``__main__`` defines:
    ``main_reference`` names a class or function of it that the work context holds. A fixed
    ``mode="process"`` is the user's call and fails with the reason; ``"auto"`` keeps to threads."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        if main_reference is None:
            return None
        return f"{main_reference} is defined in an interactive session's __main__, which spawned workers cannot import"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read(MAIN_SCRIPT_BYTES)
    except OSError:
        return None  # not a readable script (a frozen program): as fixed process workers would, try
    if _MAIN_GUARD.search(source):
        return None
    return f"the main script {path} has no 'if __name__ == \"__main__\":' guard, and spawned workers would run it again"


def choose(
    probe: Probe,
    cores: int,
    budget: int | None,
    no_processes: Callable[[], str | None],
    per_task: Callable[[float], int] = lambda seconds: 1,
    trial: Trial | None = None,
) -> AutoChoice:
    """The choice for these measurements (see the module docstring for the rules);
    ``no_processes()`` says why processes cannot be used, asked only when they would be;
    ``per_task(seconds)``: how many batches of that cost one task would hold (``grouping.py``);
    ``trial(mode, workers)``: the timings of such a pool (:func:`paces`; none: not measured),
    asked only where processes were picked for tasks under ``TRIAL_TASK_SECONDS``."""
    speedup = probe.thread_speedup
    mode, reason = _mode(probe, cores, speedup, no_processes, per_task)
    workers, bound = _bounded_workers(probe, cores, budget)
    rates = timings = None
    if mode == "process" and trial is not None and _task_seconds(probe, per_task) < TRIAL_TASK_SECONDS:
        timings = _timed(trial, workers)
        if timings is not None:
            # the fastest timing of each: a stall slows a timing, nothing speeds one up
            rates = {pool: max(readings) for pool, readings in timings.items()}
            mode, reason = _faster(rates, workers, reason)
    return AutoChoice(
        workers, mode, reason + bound, cores, probe.batch_seconds, speedup, probe.batch_bytes, rates, timings
    )


def _bounded_workers(probe: Probe, cores: int, budget: int | None) -> tuple[int, str]:
    """A worker per core, fewer where their queued batches would not fit ``budget`` (and why)."""
    if budget is None or not probe.batch_bytes:
        return cores, ""
    fit = max(1, budget // (PREFETCH_PER_WORKER * probe.batch_bytes))
    if fit >= cores:
        return cores, ""
    return int(fit), (
        f"; {fit} worker(s): {PREFETCH_PER_WORKER} queued batches of {probe.batch_bytes:,} bytes each fit {budget:,}"
    )


def _task_seconds(probe: Probe, per_task: Callable[[float], int]) -> float:
    assert probe.batch_seconds is not None  # processes are picked on a measured batch
    return per_task(probe.batch_seconds) * probe.batch_seconds


def _timed(trial: Trial, workers: int) -> dict[str, tuple[float, ...]] | None:
    """Each pool's ``TRIAL_TIMINGS`` timings, taken in turn, threads first (they start in no
    time; a process pool is not started where threads could not be timed), or None where
    either could not be timed. In turn, so that a busier stretch of the machine (another
    program's burst, pages read back in) weighs on both pools alike."""
    timers = {mode: trial(mode, workers) for mode in ("thread", "process")}  # nothing runs yet
    timings: dict[str, list[float]] = {mode: [] for mode in timers}
    try:
        for _ in range(TRIAL_TIMINGS):
            for mode, timer in timers.items():
                rate = next(timer, None)
                if rate is None:
                    return None
                timings[mode].append(rate)
    finally:
        # each pool shut down, threads first, and the processes even when that raises (a Ctrl-C
        # while the threads stop): a trial left open stops its pool only once it is collected
        try:
            timers["thread"].close()
        finally:
            timers["process"].close()
    return {mode: tuple(rates) for mode, rates in timings.items()}


def _faster(rates: dict[str, float], workers: int, reason: str) -> tuple[Mode, str]:
    timed = (
        f"timed warm on the epoch's first half ({TRIAL_TIMINGS} times each, in turn; the fastest), "
        f"{workers} thread(s) made {rates['thread']:,.0f} batches/s and {workers} process(es) {rates['process']:,.0f}"
    )
    if rates["thread"] < TRIAL_THREAD_MARGIN * rates["process"]:
        return "process", f"{reason}; {timed}"
    return "thread", f"{reason}, but {timed}: shipping these cheap tasks from a process costs more than the GIL"


def _mode(
    probe: Probe,
    cores: int,
    speedup: float | None,
    no_processes: Callable[[], str | None],
    per_task: Callable[[float], int],
) -> tuple[Mode, str]:
    if cores == 1:
        return "thread", "one usable core: one thread overlaps making batches with the consumer's work"
    if speedup is None:
        return "thread", "too few batches, or a failing sample, to measure: threads"
    assert probe.batch_seconds is not None  # a speedup is measured from it
    ms = probe.batch_seconds * 1e3
    if speedup >= THREADS_SCALE:
        return "thread", f"two threads made batches {speedup:.2f}x as fast as one: the work releases the GIL"
    batches = per_task(probe.batch_seconds)
    if batches * probe.batch_seconds < PROCESS_WORTH_SECONDS:
        task = "a batch takes" if batches == 1 else f"a task of {batches} batches of {ms:.3f} ms each takes"
        return "thread", f"{task} {batches * ms:.2f} ms, less than shipping it from a process costs"
    why = no_processes()
    if why:
        return "thread", f"threads scale {speedup:.2f}x only, but processes cannot be used: {why}"
    return "process", f"two threads made batches only {speedup:.2f}x as fast as one ({ms:.1f} ms each): the GIL"


def cost_changed(reference: float | None, now: float | None) -> bool:
    """Whether batches now cost ``RECHECK_RATIO`` times more or less than ``reference`` (seconds
    of work per batch, both counted the same way)."""
    if not reference or not now:
        return False
    ratio = now / reference
    return ratio > RECHECK_RATIO or ratio < 1 / RECHECK_RATIO
