"""Who makes the next batch: a worker, or the consumer itself.

Handing a batch to a worker and back costs the consumer something: a queue hand-off
and GIL switches for threads; pickling, a pipe round trip and a copy out of shared
memory for processes. A batch that costs less than that to make (rows of a
page-cached HDF5 file, slices of an in-memory array) is delivered faster with no
workers at all, so workers must not be a slowdown. :class:`MeasuredHandoff` measures
both ways and keeps the faster:

1. *with workers*: once the pipeline has filled, ``PROBE_BATCHES`` batches (or
   ``MEASURE_ROUNDS`` tasks a worker, if more) give the
   mean cycle (the time from one batch handed out to the next, the consumer's own work
   in between included), the mean time the consumer spent inside the loader, and the
   mean time a worker spent making a batch. Means, not medians: throughput is the
   inverse of the mean cycle, and these cycles are bimodal (most batches are ready at
   once, some are waited for), so a median would hide the waits. The workers' cycle is
   never taken below what their work allows (a batch's work over the number of workers):
   a measure that begins with tasks ready in the window drains them faster than the
   workers make them, and the consumer's time in the loader is then counted with the
   wait that the slower cycle adds;
2. when the consumer spends less than a ``GATE_RATIO``-th of a batch's making time, per
   worker, inside the loader, the workers hide that work and nothing is probed (per
   worker: N workers at once each take longer over a batch when they contend, for the
   GIL or the memory bus, so the time a batch took a worker overstates what it hides). Otherwise no
   new task goes to the workers; the ones in flight arrive, and the consumer then
   makes ``PROBE_BATCHES`` batches itself (the first, a transition, not counted, nor the
   ``ABORT_AFTER`` after it, in which the consumer opens files and fills caches of its own:
   an HDF5 file's, read at random, made its first few batches 1.5x as slow as the rest),
   stopping early once the median of its counted cycles (``ABORT_AFTER`` at least) exceeds
   ``ABORT_RATIO`` times the workers' mean. A batch the consumer took more than ``PAUSE_RATIO``
   times the probe's median to make counts at that median: a pause (a time slice lost to
   another thread or process, a garbage collection) that a few dozen batches cannot weigh.
   Two threads on HDF5 rows won the consumer's probe by such pauses (one of 2.1 ms among
   cycles of ~650 us read it 8% slower, two 16%, on a VM) and kept the batches at 0.78x its
   speed. Only the time inside the loader is capped: the consumer's own work between batches (a
   callback every few steps) is the same whoever makes them, and stays in the mean;
3. after the probe, whichever way came out faster, the workers
   are measured once more (as long as a measure, and ``CONFIRM_SECONDS`` at least, after the
   pipeline refills) and keep
   the batches only if they now beat the consumer by ``CONFIRM_MARGIN`` (a second measure
   that merely ties the probe is noise, and a tie goes to the consumer: workers are never to
   be a slowdown). One measure of each way, taken one after the other, can be off either
   way by its noise: two threads on shuffled HDF5 rows, which never beat the consumer there
   (h5py holds the GIL while it reads), once measured 239 us a batch against its 283: on
   that one measure they had kept the batches (at 0.9x its speed, in earlier runs); measured
   again, they made them at 284 us. A probe cut short (the consumer clearly slower) costs that second measure
   only, made by the workers at their own speed.
   The first measure may have been taken while the data was cold (a page
   cache filling, the kernel's readahead of a pack under way), and a consumer probed after
   it then looks faster for the warmer data, not for making batches itself: on a cold pack
   of JPEGs that kept two decoding threads' batches in one thread for a whole epoch. Where
   the workers' batches now take ``WORK_DROP`` times more or less work than at their first
   measure, the probe may have made batches of the old cost, and both ways are measured
   again (once a decision). It is
   still deciding while the workers' batches in flight arrive, until the consumer makes one;
4. the faster way is kept for at least ``RECHECK_BATCHES`` batches and
   ``RECHECK_SECONDS``, then measured again (the data, a cache or the machine's load
   may have changed). Both bounds keep the probes rare: a probe costs a few dozen
   batches at the slower way, whether batches take microseconds or seconds. It is
   measured again sooner when its own cycles (a mean over as many batches as a measure) drift
   ``DRIFT_MARGIN`` times slower than the other way was measured, or than its own measure
   (``DRIFT_RATIO`` times, where the other way was not measured), in ``DRIFT_WINDOWS`` means
   in a row (4 threads on HDF5 kept the consumer at 293-330 us a batch against workers
   measured at 365 us, and one mean of 32 batches over that, a pause, then two, sent them back
   to measuring: ~250 batches at the workers' slower pace), once between
   two rechecks (so a way whose speed swings cannot keep the loader deciding), and not in
   the first ``DRIFT_AFTER`` batches kept (the pipeline refilling after a probe read as a
   drift, and ``steadyfeed bench``'s window after a decision then held a mix) nor in the
   refill at an epoch's start (its first task is waited for whole): process workers
   reading an HDF5 file at random ran their first epoch at 200k rows/s and their third at
   86k, below the consumer's 125k, and a choice made in the first was kept for good.
   Workers kept are measured again too (once between two rechecks, as for a drift) when
   their batches take ``WORK_DROP`` times less work than when they were measured: cheaper
   batches come in faster cycles, no drift, yet the consumer may now make them faster
   (a ``MemoryCache`` after the epoch that filled it).

Who makes a batch never changes what it holds: a batch is a pure function of the
plan, the source and the seed (``run_batch`` is the only code that makes one). So the
choice shows only in speed and in ``Loader.stats()["inline_batches"]``.

What it does change is where a crash lands. A Python exception is the same
``SampleError`` either way, but a sample that kills its process (a native decoder
crashing on a corrupt file) would take the consumer down instead of one worker. Two
rules keep that from happening to data known to do it: a batch whose worker was lost
always goes back to a worker (``scheduler.py``), and after any worker loss the loader
keeps every batch in its workers (``pin_to_workers``). Batches cheap enough to be made
inline are, in practice, plain reads (array slices, raw HDF5 rows), not decoding.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sized

PROBE_BATCHES = 32
MEASURE_ROUNDS = 2  # a measure spans at least this many tasks a worker
CONFIRM_SECONDS = 0.02  # the workers' second measure spans this much at least (see _confirm)
RECHECK_BATCHES = 2000
RECHECK_SECONDS = 10.0
ABORT_RATIO = 1.25
ABORT_AFTER = 4
PAUSE_RATIO = 2.0  # a batch made here this many times slower than the probe's median is a pause
DRIFT_RATIO = 1.25  # the way kept is measured again once its cycles are this many times slower
DRIFT_MARGIN = 1.1  # or this many times slower than the other way measured, or than its own
DRIFT_AFTER = 256  # batches kept before the drift is looked at (a window measured after a decision holds one way)
DRIFT_WINDOWS = 2  # measures in a row that must drift: one slow stretch of 32 batches is noise
WORK_DROP = 2.0  # workers kept are measured again once their batches take this many times less work
CONFIRM_MARGIN = 0.9  # workers measured again keep the batches only at 0.9x the consumer's cycle or less
GATE_RATIO = 4.0
WORK_STAGES = ("read", "transform", "collate")  # making a batch; "transport" is the hand-off


def work_seconds(stage_seconds: Mapping[str, float]) -> float:
    """The seconds of ``stage_seconds`` (a batch's timings, or totals) spent making batches."""
    return sum(stage_seconds.get(stage, 0.0) for stage in WORK_STAGES)


def _without_pauses(rows: list[tuple[float, ...]]) -> float:
    """The mean cycle of ``(cycle, in_loader)`` rows of batches made here, where a time in the
    loader over ``PAUSE_RATIO`` times their median (a pause) counts as that median."""
    median = statistics.median(inside for _, inside in rows)
    return statistics.fmean(
        cycle - inside + (inside if inside <= PAUSE_RATIO * median else median) for cycle, inside in rows
    )


class FixedHandoff:
    """Always the same way: ``workers=0`` (the consumer makes every batch), or a pool that
    must keep every batch in its workers (a ``timeout``, Ray, or the option turned off)."""

    deciding = False

    def __init__(self, to_workers: bool):
        self.to_workers = to_workers

    def new_epoch(self, batches: int) -> None:
        pass

    def record(self, cycle: float, in_loader: float, timings: dict, made_here: bool) -> None:
        pass

    def pin_to_workers(self) -> None:
        pass  # workers=0 has no workers to lose; a pool that keeps every batch already does


class _Cycles:
    """The batches of one measure: each one's cycle (and what else it brought along, as
    columns), and the seconds they span."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.seconds = 0.0

    def add(self, cycle: float, *more: float) -> None:
        self.rows.append((cycle, *more))
        self.seconds += cycle

    def columns(self) -> list[tuple[float, ...]]:
        return list(zip(*self.rows))

    def mean(self) -> float:
        return self.seconds / len(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class MeasuredHandoff:
    """Measures batches made by workers and by the consumer; ``to_workers`` says which way now."""

    def __init__(
        self,
        settle: int,
        workers: int = 1,
        per_task: Callable[[], int] = lambda: 1,
        steady: Callable[[], bool] = lambda: True,
        refill: int | None = None,
    ):
        self._settle_tasks = settle  # tasks to skip after (re)starting workers: the pipeline is filling
        # tasks to skip at a later epoch's start, where the pipeline refills (one window: the
        # workers and their slots are there already)
        self._refill_tasks = settle if refill is None else refill
        self.workers = max(1, workers)
        # batches a worker's task holds now (grouping.py): the skip after a (re)start is counted in
        # tasks, since a window of tasks of 8 batches takes 8 times as long to fill. The measures
        # are not: 32 tasks of 8 batches outlasted the short epochs of a benchmark's loaders
        self._per_task = per_task
        # False while the tasks' size is being picked (grouping.py "auto"): the workers' cost is
        # about to change (and their slots to grow), so they are not measured until it is picked
        self._steady = steady
        self._watch_drift = True  # off after a drift was seen, until the next recheck
        self._drifted = 0  # looks at the way kept in a row that found it drifted
        self._settle = 0  # batches still to skip before the phase's cycles count
        self._may_restart = True  # a confirm may measure again once, where the batches changed cost
        # the work a batch took the workers, as last measured (measures end the way kept: while
        # one is kept, this is what it was picked on)
        self._workers_work = 0.0
        self._works: list[float] = []  # the work of each batch since the last look at it (workers kept)
        self._start_measuring()

    @property
    def settle(self) -> int:
        """Batches to skip after (re)starting workers."""
        return self._settle_tasks * self._per_task()

    @property
    def refill(self) -> int:
        """Batches to skip at an epoch's start."""
        return self._refill_tasks * self._per_task()

    def _measured_enough(self, cycles: Sized) -> bool:
        """Enough cycles for a mean: ``PROBE_BATCHES``, and at least ``MEASURE_ROUNDS`` tasks a
        worker. Tasks of several batches come back in rounds (4 threads, 8 batches a task: 32
        batches ready at once, then a wait for the next 32); a measure of one round's length
        took whatever part of it it began on: once the 32 ready ones, at a 19 us cycle."""
        return len(cycles) >= max(PROBE_BATCHES, MEASURE_ROUNDS * self.workers * self._per_task())

    @property
    def deciding(self) -> bool:
        """Measuring or probing: batches now may be made either way, at either speed."""
        return self._phase in ("measure", "probe", "confirm", "handover")

    def pin_to_workers(self) -> None:
        """A worker was lost: from now on every batch is made by a worker."""
        self._phase, self.to_workers = "pinned", True

    def new_epoch(self, batches: int) -> None:
        """The pipeline starts empty for an epoch that hands out ``batches`` more batches: a
        measure of the workers in progress skips its refill (one window of tasks, or what is
        left of a longer skip: the two windows after a start) and goes on with what it has.
        The refill skipped is at most half the epoch, so every epoch adds to the measure: a
        skip as long as the epoch, at each epoch, never ended (a skip of two windows, as after
        a start, on 2 processes on 157 batches of JPEG, 11 a task; one window, on 63 batches
        of 2,000 JPEGs), and the loader said "deciding" for good.
        Workers kept skip the refill before their cycles count towards a drift again: the
        first task of an epoch is waited for whole (8 batches of JPEG, ~25 ms on 2 processes),
        and read as a drift it made loaders probe the consumer again in every epoch."""
        refill = min(self.refill, batches // 2)
        if self._phase in ("measure", "confirm"):
            self._settle = max(self._settle, refill)
        elif self._phase == "keep" and self.to_workers:
            self._recent = _Cycles()
            self._refill = refill

    def record(self, cycle: float, in_loader: float, timings: dict, made_here: bool) -> None:
        """One batch handed out: ``cycle`` seconds since the previous one, ``in_loader`` of them
        inside the loader; ``timings``, its stage times (``run_batch``), by whoever made it."""
        if self._phase == "measure":
            self._measure(cycle, in_loader, work_seconds(timings))
        elif self._phase == "probe":
            if made_here:  # batches still in flight from the workers do not count
                self._probe(cycle, in_loader)
        elif self._phase == "confirm":
            if not made_here:
                self._confirm(cycle, work_seconds(timings))
        elif self._phase == "handover":  # the workers' batches in flight arrive first
            if made_here:
                self._keep(to_workers=False, cycle=self._here_cycle, rival=self._again_cycle)
        elif self._phase == "keep":
            self._kept_batches += 1
            self._kept_seconds += cycle
            if self._kept_batches >= RECHECK_BATCHES and self._kept_seconds >= RECHECK_SECONDS:
                self._watch_drift = True
                self._start_measuring()
            elif self._refill > 0:
                self._refill -= 1
            elif self._watch_drift and self.to_workers and self._look_for_cheaper_work(work_seconds(timings)):
                self._watch_drift = False  # once between two rechecks, as for a drift
                self._start_measuring()
            elif self._watch_drift and self._kept_batches > DRIFT_AFTER:
                self._look_for_drift(cycle)

    def _look_for_cheaper_work(self, work: float) -> bool:
        """Workers kept: whether a window of their batches, the last with ``work``, took
        ``WORK_DROP`` times less work than when they were measured. Cheaper batches come in
        faster cycles, never read as a drift, yet the consumer may now make them faster than
        the hand-off costs: a ``MemoryCache`` filled by its first epoch of JPEGs kept 2
        threads copying cached batches, slower than ``workers=0``, until the recheck."""
        self._works.append(work)
        if not self._measured_enough(self._works):
            return False
        cheaper = statistics.fmean(self._works) * WORK_DROP < self._workers_work
        self._works = []
        return cheaper

    def _look_for_drift(self, cycle: float) -> None:
        self._recent.add(cycle)
        if not self._measured_enough(self._recent):
            return
        self._drifted = self._drifted + 1 if self._recent.mean() > self._drift_limit else 0
        self._recent = _Cycles()
        if self._drifted >= DRIFT_WINDOWS:
            # once per recheck: a way that drifts back and forth cannot keep the loader deciding
            self._watch_drift = False
            self._start_measuring()

    def _start_measuring(self) -> None:
        self._phase, self.to_workers = "measure", True
        self._settle, self._unsteady = self.settle, False
        self._pooled = _Cycles()  # (cycle, in_loader, work) of each batch measured

    def _measure(self, cycle: float, in_loader: float, work: float) -> None:
        if not self._steady():
            self._unsteady = True
            return
        if self._unsteady:  # now steady: the pipeline refills with tasks of the new size first
            self._unsteady, self._settle = False, self.settle
        if self._settle > 0:
            self._settle -= 1
            return
        self._pooled.add(cycle, in_loader, work)
        if not self._measured_enough(self._pooled):
            return
        cycles, in_loaders, works = self._pooled.columns()
        self._pooled_cycle = self._workers_cycle(cycles, works)
        self._workers_work = statistics.fmean(works)
        # a measure that drained a window of ready batches saw the consumer wait less than the
        # workers' pace will make it: the cycle it is taken at adds that wait inside the loader
        waited = statistics.fmean(in_loaders) + self._pooled_cycle - statistics.fmean(cycles)
        if waited * GATE_RATIO < statistics.fmean(works) / self.workers:
            # the workers hide the work: making it here would add it
            self._keep(to_workers=True, cycle=self._pooled_cycle, rival=None)
        else:
            self._phase, self.to_workers = "probe", False
            self._here: _Cycles | None = None  # (cycle, in_loader) of batches made here, once steady

    def _probe(self, cycle: float, in_loader: float) -> None:
        if self._here is None:  # the first batch made here follows the switch: not a steady cycle
            self._here = _Cycles()
            return
        self._here.add(cycle, in_loader)
        warm = self._here.rows[ABORT_AFTER:]  # the first few open files and fill caches of the consumer's own
        median = statistics.median(c for c, _ in warm) if len(warm) >= ABORT_AFTER else 0.0
        if median > ABORT_RATIO * self._pooled_cycle:  # clearly slower: no need to probe on
            self._start_confirming(here=median)
        elif len(self._here) >= PROBE_BATCHES:
            self._start_confirming(here=_without_pauses(warm))

    def _start_confirming(self, here: float) -> None:
        """Measure the workers again, against a consumer probed at a mean cycle of ``here``,
        whichever came out faster (point 3 of the module's docstring)."""
        self._phase, self.to_workers = "confirm", True
        self._here_cycle, self._settle = here, self.settle
        self._again = _Cycles()  # (cycle, work)

    def _workers_cycle(self, cycles, works) -> float:
        """The workers' mean cycle, never below what their work allows: ``workers`` of them
        make a batch every ``mean(works) / workers`` seconds at best. A measure that starts
        with batches ready in the window (one task of 8 batches makes 8 ready at once) drains
        them faster than the workers make batches: 4 threads measured a 148 us cycle for 394
        us of work per batch each, then ran epochs at 350 us a batch, slower than the consumer."""
        return max(statistics.fmean(cycles), statistics.fmean(works) / self.workers)

    def _confirm(self, cycle: float, work: float) -> None:
        if self._settle > 0:
            self._settle -= 1
            return
        self._again.add(cycle, work)
        # The measure that can hand every batch to the consumer (for RECHECK_SECONDS) spans
        # CONFIRM_SECONDS: where more threads run than there are cores, one waits out another's
        # time slice now and then (1-4 ms: a consumer and 2 processes on 2 cores). 32 batches of
        # HDF5 rows span 2.4 ms, and one such wait among them read 2 processes at 170 us a
        # batch, where they run at 73 us: the consumer then made every batch at 0.69x their speed.
        if not self._measured_enough(self._again) or self._again.seconds < CONFIRM_SECONDS:
            return
        cycles, works = self._again.columns()
        again = self._again_cycle = self._workers_cycle(cycles, works)
        work, self._workers_work = self._workers_work, statistics.fmean(works)
        if self._may_restart and max(work, self._workers_work) > WORK_DROP * min(work, self._workers_work):
            # the batches changed cost since the workers' first measure (a MemoryCache filled
            # in between): the consumer's probe may have made batches of the old cost, and 2
            # threads copying cached JPEGs at 0.58 ms a batch beat a probe that had decoded
            # them at 3.5 ms. Once a decision: a cost that keeps changing is decided as it is
            self._may_restart = False
            self._start_measuring()
            return
        if again <= CONFIRM_MARGIN * self._here_cycle:
            self._keep(to_workers=True, cycle=again, rival=self._here_cycle)
        else:
            self._phase, self.to_workers = "handover", False

    def _keep(self, to_workers: bool, cycle: float, rival: float | None) -> None:
        """Keep one way, measured at a mean ``cycle``, the other at ``rival`` (None: not measured).
        Measured again once the way kept is ``DRIFT_MARGIN`` times slower than the slower of its
        rival and itself were (a tie goes to the way kept, as ``CONFIRM_MARGIN`` gives it to the
        consumer: two close measures must not make it flip back and forth), or ``DRIFT_RATIO``
        times its own cycle when the rival was not measured."""
        self._phase, self.to_workers = "keep", to_workers
        self._kept_batches, self._kept_seconds = 0, 0.0
        self._drift_limit = DRIFT_RATIO * cycle if rival is None else DRIFT_MARGIN * max(rival, cycle)
        self._recent = _Cycles()  # cycles since the last look at the drift
        self._drifted = 0
        self._works = []
        self._may_restart = True
        self._refill = 0  # batches of an epoch's start not looked at for a drift


def make_handoff(
    config, per_task: Callable[[], int] = lambda: 1, steady: Callable[[], bool] = lambda: True
) -> FixedHandoff | MeasuredHandoff:
    """The handoff a ``LoaderConfig`` asks for; ``per_task``: how many batches a task holds now;
    ``steady``: whether that number is settled. The skip after a (re)start is a window of
    tasks; two in process mode, where the first window's tasks also make each worker's slots;
    at a later epoch's start, one.
    One for threads: two windows of 4 threads (16 tasks of 8 batches each) made every measure
    skip 256 batches, and the first decision outlasted a 625-batch epoch (probed, confirmed)."""
    if config.execution.workers == 0:
        return FixedHandoff(to_workers=False)
    if not config.makes_batches_inline:
        return FixedHandoff(to_workers=True)
    windows = 2 if config.execution.mode == "process" else 1
    return MeasuredHandoff(
        settle=windows * config.execution.effective_prefetch,
        workers=config.execution.workers,
        per_task=per_task,
        steady=steady,
        refill=config.execution.effective_prefetch,
    )
