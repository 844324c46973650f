"""Benchmark one loader over a grid of ``workers`` x ``mode``, and say what limits it.

    from steadyfeed.tools.bench import bench, grid
    report = bench(loader, grid([0, 1, 2], ["thread", "process"]), max_batches=100, consumer_ms=20)
    report.recommendation.setting, report.bottleneck.reason, report.as_dict()

What is guaranteed:

* every setting runs on ``loader.replace(workers=..., mode=...)``: the same source,
  transform, batch size and seed; ``loader`` itself is never iterated;
* settings run one after another, each loader closed before the next starts, so no
  worker, CPU time or memory of one setting is counted in another;
* a setting that raises (a ``SampleError``, a worker that cannot start, ...) is recorded
  with its error and the remaining settings still run;
* the first ``warmup`` batches (worker start-up included) are left out of throughput,
  stage times, queue fill and CPU, and so are the batches after them while the loader
  still decides who makes batches (``Loader.handoff == "deciding"``: it measures workers
  against the consumer making them, and the workers again when the consumer wins; its skips
  after a restart are counted in tasks, so with several cheap batches a task this takes a few
  hundred batches), up to ``WARMUP_WHILE_DECIDING`` more and never more than half of what is
  left (``Measurement.warmup_batches`` says how many);
  ``warmup=0`` measures everything. The latency of the first batch, start-up included,
  is reported on its own (``first_batch_seconds``);
* the figures come from ``loader.stats()``, the loader's own measurements, plus psutil
  for CPU time and peak resident memory of this process and its worker processes;
* with ``repeat`` runs per setting (taken in turns: every setting once, then again, so a
  passing load on the machine falls on all of them), a setting's samples/s is the median
  run's and its spread the range of its runs; a setting is recommended only when it beats
  every other in every run by more than ``NEAR_FASTEST`` (its slowest run faster than their
  fastest), otherwise the report says which settings tie and names the cheapest of them.

Stage times: ``read``, ``transform`` and ``collate`` are summed over workers (their share
is of total worker time); ``transport`` (copying a batch out of shared memory, in the
consumer's process), ``wait`` (the consumer blocked on the next batch) and ``step`` (the
simulated training step, ``consumer_ms``) happen in the consumer (their share is of wall time). No source
reports decoding separately, so ``read`` includes decoding. With ``workers=0`` the worker
stages run inside the consumer's ``wait``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field

import psutil

from ..config import AUTO
from ..stats import STAGES, stats_delta
from .spec import _one_line as one_line  # the commands' one-line form of an error

FORMAT = "steadyfeed.bench/2"
CONSUMER_SIDE = ("transport", "wait", "step")  # in the consumer's process: shares are of wall time
WORKER_SIDE = tuple(s for s in STAGES if s not in CONSUMER_SIDE)  # summed over workers
READ_INCLUDES_DECODE = "decode" not in STAGES  # no source times its decoding apart from its reading
NEAR_FASTEST = 0.05  # beating another setting takes more than this margin over its fastest run
PRODUCER_BOUND_WAIT = 0.5  # the consumer waits at least half the time: the loader limits training
CONSUMER_BOUND_WAIT = 0.1  # the consumer almost never waits: its own step limits training
GIL_MIN_SPEEDUP = 1.3  # more thread workers that gain less than this ...
GIL_MAX_CORES = 1.2  # ... while using under this many cores are held back by the GIL
CPU_MIN_SECONDS = 0.25  # shorter windows get no CPU figure: the OS counts CPU time in 10 ms ticks
# at most this many more warm-up batches while the loader decides who makes them: a first decision
# on cheap batches, 8 a task, took ~450 with processes (skips of two windows of tasks before each measure
# of the workers; one with threads); with 200, the window opened while it was deciding and held a mix of both ways
WARMUP_WHILE_DECIDING = 600


# -- the grid -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One point of the grid. ``cost`` ranks settings cheapest first: fewer workers, then
    threads before processes; ``workers="auto"`` (mode "auto": it picks both) last."""

    workers: int | str
    mode: str

    @property
    def cost(self) -> tuple[float, bool]:
        return (math.inf if self.workers == AUTO else float(self.workers), self.mode == "process")

    @property
    def label(self) -> str:
        return "inline" if self.workers == 0 else AUTO if self.workers == AUTO else f"{self.workers} {self.mode}"


def grid(workers: Iterable[int | str], modes: Iterable[str]) -> list[Setting]:
    """Every (workers, mode) pair, cheapest first. ``workers=0`` runs in the consumer's
    thread whatever the mode, so it appears once; so does ``"auto"``, which picks the mode."""
    modes = list(modes)
    settings = {Setting(w, "thread" if w == 0 else AUTO if w == AUTO else m) for w in workers for m in modes}
    return sorted(settings, key=lambda s: s.cost)


# -- resources ------------------------------------------------------------------------------
def _live_children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def cpu_seconds(proc: psutil.Process | None = None) -> float:
    """CPU seconds (user + system) used so far by this process, its live children and its
    reaped children. A difference of two readings is the CPU a stretch of work cost."""
    proc = proc or psutil.Process()
    own = proc.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    for child in _live_children(proc):
        with contextlib.suppress(psutil.Error):  # a child may exit between listing and reading
            times = child.cpu_times()
            total += times.user + times.system
    return total


def rss_bytes(proc: psutil.Process | None = None) -> int:
    """Resident memory of this process plus its live children (pages they share are
    counted in each, so this is an upper bound)."""
    proc = proc or psutil.Process()
    total = proc.memory_info().rss
    for child in _live_children(proc):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


class PeakMemory:
    """``with PeakMemory() as peak: ...`` then ``peak.bytes``: the highest ``rss_bytes()``
    seen while the block ran, sampled every ``interval`` seconds by a background thread
    and once on entry and exit (so a short block is still measured). The thread is
    joined on exit."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.bytes = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steadyfeed-bench-memory", daemon=True)

    def _sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.bytes = max(self.bytes, rss_bytes(self._proc))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- one setting ----------------------------------------------------------------------------
@dataclass
class Diagnosis:
    kind: str  # "producers", "consumer", "balanced" or "gil"
    reason: str
    setting: Setting | None = None


@dataclass
class Measurement:
    """What one setting did in its measured window (after warm-up)."""

    setting: Setting
    error: str | None = None
    batches: int = 0
    inline_batches: int = 0  # made by the consumer itself (execution/handoff.py)
    samples: int = 0
    seconds: float = 0.0  # wall time of the measured window
    first_batch_seconds: float | None = None  # from starting the epoch, worker start-up included
    stage_seconds: dict = field(default_factory=lambda: dict.fromkeys(WORKER_SIDE + CONSUMER_SIDE, 0.0))
    prefetch: int = 0
    picked: dict | None = None  # workers="auto": what it picked and why (Loader.stats()["auto"])
    warmup_batches: int = 0  # left out: the warm-up asked for, plus any while the loader was deciding
    fill_mean: float = 0.0
    fill_max: int = 0
    timeline: list = field(default_factory=list)  # (seconds since the setting started, batches ready)
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    skipped: int = 0  # samples quarantined in the window (on_error="skip")
    diagnosis: Diagnosis | None = None
    runs: list = field(default_factory=list)  # samples/s of every run of the setting (its figures: the median's)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def window_samples_per_second(self) -> float:
        """This run's throughput."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def samples_per_second(self) -> float:
        """The median run's throughput (this run's, when it ran once)."""
        return float(sorted(self.runs)[len(self.runs) // 2]) if self.runs else self.window_samples_per_second

    @property
    def slowest(self) -> float:
        return min(self.runs) if self.runs else self.samples_per_second

    @property
    def fastest(self) -> float:
        return max(self.runs) if self.runs else self.samples_per_second

    @property
    def spread(self) -> float:
        """The range of the runs as a share of the median (0 for one run)."""
        median = self.samples_per_second
        return (self.fastest - self.slowest) / median if median > 0 else 0.0

    def beats(self, other: Measurement) -> bool:
        """Faster in every run than ``other`` in any, by more than NEAR_FASTEST."""
        return self.slowest > (1 + NEAR_FASTEST) * other.fastest

    @property
    def cpu_cores(self) -> float | None:
        """Cores busy on average; None for a window too short for the OS's CPU clock (ticks
        of 10 ms per process: 8 batches in 1 ms would read as several cores, or none)."""
        return self.cpu_seconds / self.seconds if self.seconds >= CPU_MIN_SECONDS else None

    def share(self, stage: str) -> float:
        """Worker stages: share of total worker time; consumer stages: share of wall time."""
        if stage in CONSUMER_SIDE:
            whole = self.seconds
        else:
            whole = sum(self.stage_seconds[s] for s in WORKER_SIDE)
        return self.stage_seconds[stage] / whole if whole > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "label": self.setting.label,
            "workers": self.setting.workers,
            "mode": self.setting.mode,
            "picked": self.picked,
            "ok": self.ok,
            "error": self.error,
            "batches": self.batches,
            "inline_batches": self.inline_batches,
            "warmup_batches": self.warmup_batches,
            "samples": self.samples,
            "seconds": self.seconds,
            "samples_per_second": self.samples_per_second,
            "runs": list(self.runs) or [self.samples_per_second],
            "spread": self.spread,
            "skipped": self.skipped,
            "first_batch_seconds": self.first_batch_seconds,
            "stages": {
                stage: {
                    "seconds": seconds,
                    "share": self.share(stage),
                    "side": "consumer" if stage in CONSUMER_SIDE else "workers",
                }
                for stage, seconds in self.stage_seconds.items()
            },
            "queue": {
                "prefetch": self.prefetch,
                "fill_mean": self.fill_mean,
                "fill_max": self.fill_max,
                "timeline": [list(point) for point in self.timeline],
            },
            "cpu_seconds": self.cpu_seconds,
            "cpu_cores": self.cpu_cores,
            "peak_rss_bytes": self.peak_rss_bytes,
            "bottleneck": None
            if self.diagnosis is None
            else {"kind": self.diagnosis.kind, "reason": self.diagnosis.reason},
        }


@dataclass
class _Mark:
    """The loader's counters at one moment, so a window is the difference of two marks."""

    time: float
    cpu: float
    stats: dict


def _mark(loader) -> _Mark:
    return _Mark(time.perf_counter(), cpu_seconds(), loader.stats())


def _epochs(loader, epochs: int) -> Generator[dict, None, None]:
    for epoch in range(epochs):
        yield from loader.epoch(epoch)


def _window(m: Measurement, start: _Mark, end: _Mark, step_seconds: float) -> None:
    """Fill ``m`` with what happened between two marks."""
    before, after = start.stats, end.stats
    delta = stats_delta(before, after)
    m.seconds = end.time - start.time
    m.cpu_seconds = end.cpu - start.cpu
    m.batches, m.inline_batches, m.samples = delta["batches"], delta["inline_batches"], delta["samples"]
    m.skipped = delta["skipped"]
    m.stage_seconds.update(
        {stage: delta["stage_seconds"].get(stage, 0.0) for stage in STAGES},
        wait=delta["wait_seconds"],
        step=step_seconds,
    )
    # the window's points, in seconds since it opened: every setting's timeline starts at 0
    opened = before["queue_fill_timeline"][-1][0] if before["queue_fill_timeline"] else 0.0
    m.timeline = [(t - opened, ready) for t, ready in after["queue_fill_timeline"] if t > opened]
    m.fill_mean = delta["queue_fill_mean"]
    m.fill_max = max((ready for _, ready in m.timeline), default=0)


def measure(
    loader,
    setting: Setting,
    *,
    epochs: int = 1,
    max_batches: int | None = None,
    warmup: int = 2,
    consumer_ms: float = 0.0,
    on_batch: Callable[[Setting], None] | None = None,
) -> Measurement:
    """Run ``setting`` on a copy of ``loader`` and measure it; never raises for a failing
    setting (the error is in ``Measurement.error``; an ``Exception`` from ``on_batch`` counts
    as one too, a ``KeyboardInterrupt`` stops the run).

    Takes up to ``max_batches`` batches after the warm-up (``max_batches=None``: no bound) from
    ``epochs`` epochs, sleeping ``consumer_ms`` after each to stand in for a training step.
    """
    m = Measurement(setting)
    with PeakMemory() as peak:
        try:
            # timeout needs workers; inline has none to interrupt, so it runs without one rather than fail
            inline = {"timeout": None} if setting.workers == 0 else {}
            mode = "thread" if setting.mode == AUTO else setting.mode  # "auto" picks it as it starts
            with loader.replace(workers=setting.workers, mode=mode, **inline) as variant:
                _drive(
                    variant,
                    m,
                    epochs=epochs,
                    max_batches=max_batches,
                    warmup=warmup,
                    consumer_ms=consumer_ms,
                    on_batch=on_batch or (lambda s: None),
                )
                stats = variant.stats()
                m.prefetch, m.picked = stats["prefetch"], stats.get("auto")
        except Exception as exc:  # noqa: BLE001 - a failing setting is reported; the others still run
            m.error = one_line(exc)  # the type and first line: a SampleError's names the sample
    m.peak_rss_bytes = peak.bytes
    return m


def _drive(variant, m: Measurement, *, epochs, max_batches, warmup, consumer_ms, on_batch) -> None:
    start = _mark(variant) if warmup == 0 else None
    # After `warmup` batches the window opens once the loader has decided who makes batches
    # (its first decision measures both ways, a few hundred batches), but at the latest where half of
    # what is left remains to be measured.
    latest = warmup + min(WARMUP_WHILE_DECIDING, max(0, epochs * len(variant) - warmup) // 2)
    taken, step_seconds = 0, 0.0
    begun = time.perf_counter()  # workers start on the first request, so their start-up is in the latency
    with contextlib.closing(_epochs(variant, epochs)) as batches:  # closing stops the workers early
        for _ in batches:
            taken += 1
            if taken == 1:
                m.first_batch_seconds = time.perf_counter() - begun
            if consumer_ms:
                t0 = time.perf_counter()
                time.sleep(consumer_ms / 1000)
                if start is not None:  # a warm-up batch's step is not in the window
                    step_seconds += time.perf_counter() - t0
            on_batch(m.setting)
            if start is None and taken >= warmup and (taken >= latest or variant.handoff != "deciding"):
                start = _mark(variant)
                m.warmup_batches = taken
            if max_batches and start is not None and taken - m.warmup_batches >= max_batches:
                break
        end = _mark(variant)  # before closing: stopping the workers is not part of the window
    if start is None or taken <= m.warmup_batches:
        raise ValueError(
            f"only {taken} batch(es) in {epochs} epoch(s), none left after {warmup} warm-up "
            "batch(es): lower warmup or run more epochs"
        )
    _window(m, start, end, step_seconds)


# -- what limits it -------------------------------------------------------------------------
def _busiest_worker_stage(m: Measurement) -> str:
    stage = max(WORKER_SIDE, key=m.share)
    return f"the {stage} takes {m.share(stage):.0%} of worker time"


def _consumer_work(m: Measurement) -> str:
    """What keeps the consumer busy: the (simulated) training step, or else the loader's
    own per-batch work in the consumer's thread (handing out batches, transport)."""
    if m.share("step") >= 0.5:
        return f"the consumer (your training step, {m.share('step'):.0%} of the time)"
    return (
        "the consumer thread's per-batch work (handing out batches, transport "
        f"{m.share('transport'):.0%}; larger batches amortise it)"
    )


def diagnose(m: Measurement) -> Diagnosis:
    """Producer-bound, consumer-bound or balanced, from how long the consumer waited."""
    wait = m.share("wait")
    queue = f"mean {m.fill_mean:.1f} of prefetch {m.prefetch}"
    if m.setting.workers == 0:
        if wait >= PRODUCER_BOUND_WAIT:
            return Diagnosis(
                "producers",
                f"loading runs in the consumer's thread and takes {wait:.0%} of the "
                f"time; {_busiest_worker_stage(m)}: use workers",
                m.setting,
            )
        return Diagnosis(
            "consumer",
            f"loading takes only {wait:.0%} of the time in the consumer's thread: "
            f"{_consumer_work(m)} is the bottleneck",
            m.setting,
        )
    if wait >= PRODUCER_BOUND_WAIT:
        reason = (
            f"consumer waits {wait:.0%} of the time and the queue is nearly empty ({queue}): the producers "
            f"are the bottleneck; {_busiest_worker_stage(m)}"
        )
        if m.share("transport") >= 0.2:
            reason += f"; copying batches out of shared memory takes {m.share('transport'):.0%} of the time"
        return Diagnosis("producers", reason, m.setting)
    if wait < CONSUMER_BOUND_WAIT:
        return Diagnosis(
            "consumer",
            f"queue stays full ({queue}) and the consumer waits only {wait:.0%} of the "
            f"time: {_consumer_work(m)} is the bottleneck",
            m.setting,
        )
    return Diagnosis(
        "balanced",
        f"consumer waits {wait:.0%} of the time ({queue}): loading and the consumer "
        f"are close; {_busiest_worker_stage(m)}",
        m.setting,
    )


def gil_limited(measurements: list[Measurement]) -> Diagnosis | None:
    """Thread workers that do not speed up past one (or past inline) while using little CPU:
    Python code holding the GIL, which ``mode="process"`` avoids."""
    ok = {m.setting: m for m in measurements if m.ok}
    base = ok.get(Setting(1, "thread")) or ok.get(Setting(0, "thread"))
    if base is None:
        return None
    for m in sorted(
        (
            m
            for m in ok.values()
            if m.setting.mode == "thread" and isinstance(m.setting.workers, int) and m.setting.workers >= 2
        ),
        key=lambda m: m.setting.workers,
        reverse=True,
    ):
        stuck = m.samples_per_second < GIL_MIN_SPEEDUP * base.samples_per_second
        if (
            m.diagnosis is not None
            and m.diagnosis.kind == "producers"
            and stuck
            and m.cpu_cores is not None
            and m.cpu_cores < GIL_MAX_CORES
        ):
            return Diagnosis(
                "gil",
                f"GIL: thread workers do not scale beyond {max(base.setting.workers, 1)} "
                f"({m.setting.label}: {m.samples_per_second:,.0f} samples/s, {base.setting.label}: "
                f"{base.samples_per_second:,.0f}) while CPU < {GIL_MAX_CORES} cores "
                f"({m.cpu_cores:.2f}): {_process_advice(m, ok.values())}",
                m.setting,
            )
    return None


def _process_advice(threads: Measurement, ok: Iterable[Measurement]) -> str:
    """What process workers did against the held-back thread setting, as advice."""
    processes = [m for m in ok if m.setting.mode == "process"]
    if not processes:
        return "use mode='process'"
    best = max(processes, key=lambda m: m.samples_per_second)
    if best.samples_per_second > threads.samples_per_second:
        return f"use mode='process' ({best.setting.label}: {best.samples_per_second:,.0f} samples/s)"
    return (
        f"process workers were no faster here ({best.setting.label}: {best.samples_per_second:,.0f} samples/s): "
        "the per-batch cost of processes outweighs the work; try larger batches with mode='process'"
    )


@dataclass
class Recommendation:
    """``verdict`` "recommended": ``setting`` beats every other; "tie": ``tied`` (cheapest first)
    are not told apart by their runs, and ``setting`` is the cheapest of them."""

    setting: Setting
    samples_per_second: float
    reason: str
    verdict: str = "recommended"
    tied: list = field(default_factory=list)


def _runs_text(m: Measurement) -> str:
    return (
        f"{m.samples_per_second:,.0f} samples/s"
        if len(m.runs) < 2
        else f"{m.samples_per_second:,.0f} samples/s, runs {m.slowest:,.0f}-{m.fastest:,.0f}"
    )


def recommend(measurements: list[Measurement]) -> Recommendation | None:
    """The fastest setting that worked, when it beats every other (``Measurement.beats``: in
    every run, by more than NEAR_FASTEST); else a tie of it and those it does not beat,
    with the cheapest of them named."""
    ok = [m for m in measurements if m.ok]
    if not ok:
        return None
    fastest = max(ok, key=lambda m: m.samples_per_second)
    tied = sorted((m for m in ok if m is fastest or not fastest.beats(m)), key=lambda m: m.setting.cost)
    if len(tied) == 1:
        others = (
            "" if len(ok) == 1 else (f", faster in every run than any other setting by more than {NEAR_FASTEST:.0%}")
        )
        return Recommendation(fastest.setting, fastest.samples_per_second, f"fastest ({_runs_text(fastest)}){others}")
    cheapest = tied[0]
    listed = "; ".join(f"{m.setting.label}: {_runs_text(m)}" for m in tied)
    reason = (
        f"{len(tied)} settings tie: the fastest does not beat them by more than the spread of their runs "
        f"(and {NEAR_FASTEST:.0%}) ({listed}); any of them will do, the cheapest is {cheapest.setting.label}"
    )
    return Recommendation(cheapest.setting, cheapest.samples_per_second, reason, "tie", [m.setting for m in tied])


# -- the whole grid -------------------------------------------------------------------------
@dataclass
class Report:
    measurements: list[Measurement]
    recommendation: Recommendation | None
    bottleneck: Diagnosis | None  # the GIL when threads are held back, else what limits the recommended setting
    options: dict  # what ran and how: source, batch_size, epochs, max_batches, warmup_batches, consumer_ms

    @property
    def failed(self) -> list[Measurement]:
        return [m for m in self.measurements if not m.ok]

    def as_dict(self) -> dict:
        """JSON-ready, with stable keys (``format`` names the layout)."""
        rec, neck = self.recommendation, self.bottleneck
        return {
            "format": FORMAT,
            **self.options,
            "read_includes_decode": READ_INCLUDES_DECODE,
            "settings": [m.as_dict() for m in self.measurements],
            "bottleneck": None
            if neck is None
            else {
                "kind": neck.kind,
                "setting": None if neck.setting is None else neck.setting.label,
                "reason": neck.reason,
            },
            "recommendation": None
            if rec is None
            else {
                "verdict": rec.verdict,
                "label": rec.setting.label,
                "workers": rec.setting.workers,
                "mode": rec.setting.mode,
                "samples_per_second": rec.samples_per_second,
                "tied": [s.label for s in rec.tied],
                "reason": rec.reason,
            },
        }


def bench(
    loader,
    settings: list[Setting],
    *,
    epochs: int = 1,
    max_batches: int | None = None,
    warmup: int = 2,
    consumer_ms: float = 0.0,
    repeat: int = 1,
    on_batch: Callable[[Setting], None] | None = None,
    on_run: Callable[[Setting, int], None] | None = None,
) -> Report:
    """Measure every setting ``repeat`` times, in turns (see ``measure``; ``on_run(setting,
    round)`` is called before each run), then diagnose and recommend."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    runs: dict[Setting, list[Measurement]] = {setting: [] for setting in settings}
    for round_ in range(repeat):
        for setting in settings:
            if runs[setting] and not runs[setting][-1].ok:
                continue  # a setting that failed once is reported with that error
            if on_run is not None:
                on_run(setting, round_)
            runs[setting].append(
                measure(
                    loader,
                    setting,
                    epochs=epochs,
                    max_batches=max_batches,
                    warmup=warmup,
                    consumer_ms=consumer_ms,
                    on_batch=on_batch,
                )
            )
    measurements = [_combined(found) for found in runs.values()]
    for m in measurements:
        m.diagnosis = diagnose(m) if m.ok else None
    recommendation = recommend(measurements)
    bottleneck = gil_limited(measurements)
    if bottleneck is None and recommendation is not None:
        bottleneck = next(m.diagnosis for m in measurements if m.setting == recommendation.setting)
    options = {
        "source": repr(loader.source),
        "batch_size": loader.config.read.batch_size,
        "epochs": epochs,
        "max_batches": max_batches,
        "warmup_batches": warmup,
        "consumer_ms": consumer_ms,
        "repeat": repeat,
    }
    return Report(measurements, recommendation, bottleneck, options)


def _combined(runs: list[Measurement]) -> Measurement:
    """One setting's runs as one Measurement: a failed run's, or the median run's figures with
    every run's samples/s (and the highest memory peak)."""
    failed = next((m for m in runs if not m.ok), None)
    if failed is not None:
        return failed
    speeds = [m.window_samples_per_second for m in runs]
    median = sorted(runs, key=lambda m: m.window_samples_per_second)[len(runs) // 2]
    median.runs, median.peak_rss_bytes = speeds, max(m.peak_rss_bytes for m in runs)
    return median
