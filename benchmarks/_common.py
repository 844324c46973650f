"""Helpers shared by the benchmark scripts: results, timing, tables, the run line, and the
way Keras ``PyDataset`` is iterated (as ``fit`` does).

Kept light (numpy and steadyfeed only at import): steadyfeed's process workers are spawned
and re-import the running script, and with it this module.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

import steadyfeed

os.environ["KERAS_BACKEND"] = "torch"  # only torch is installed as a Keras backend here

EpochFn = Callable[[int], bool]  # runs epoch e, returns whether it covered every sample
# (family, label, runner, keyword arguments): ``runner(..., **kwargs)`` opens a loader as an EpochFn
Setting = tuple[str, str, Callable[..., AbstractContextManager[EpochFn]], dict[str, Any]]


@dataclass
class Result:
    family: str  # "steadyfeed", a peer ("keras", "torch", "tf.data") or a reference ("h5py")
    setting: str
    samples: int
    seconds: float
    covered: bool
    peer: bool | None = None  # None: every family but steadyfeed is a peer
    rounds: tuple[float, ...] = ()  # seconds of an epoch in each round, in run order (see paired)
    group: str = ""  # the loaders timed in the same rounds share one (see paired)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def is_peer(self) -> bool:
        return self.family != "steadyfeed" if self.peer is None else self.peer

    @property
    def label(self) -> str:
        return f"{self.family} {self.setting}"


def photo_like(rng: np.random.Generator, side: int) -> np.ndarray:
    """A photo-like uint8 image ``(side, side, 3)``: a smooth random colour field plus noise
    (about 8 KB as a quality-90 JPEG at 128 x 128)."""
    from PIL import Image

    field = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize(
        (side, side), Image.Resampling.BILINEAR
    )
    noise = rng.normal(0, 12, (side, side, 3))
    return np.clip(np.asarray(field, np.float64) + noise, 0, 255).astype(np.uint8)


def time_epochs(epoch: EpochFn, epochs: int, warmup: bool = True) -> tuple[bool, float]:
    """Runs a warm-up epoch (0, which also starts workers and touches the data) unless told
    not to, then ``epochs`` timed ones; returns (every epoch covered, median seconds)."""
    covered = epoch(0) if warmup else True
    seconds = []
    for e in range(1, epochs + 1):
        t0 = time.perf_counter()
        covered &= epoch(e)
        seconds.append(time.perf_counter() - t0)
    return covered, statistics.median(seconds)


class Timing(NamedTuple):
    """One loader's timed epochs: whether every epoch covered every sample, the first warm-up's
    seconds, the median timed epoch's seconds, and each round's (see ``paired``)."""

    covered: bool
    warm: float
    seconds: float
    rounds: tuple[float, ...]


def paired(a: Result, b: Result) -> float:
    """``a``'s rate over ``b``'s: the median of their ratios round by round, where both ran
    within seconds of each other. A machine whose speed drifts over minutes (30-50% on a shared
    2-core VM) then slows both sides of each ratio alike, where a ratio of the two medians
    compares epochs run minutes apart. Falls back to that ratio where the two were not timed
    in the same rounds (no group, or different ones)."""
    if not a.rounds or not a.group or a.group != b.group or len(a.rounds) != len(b.rounds):
        return a.rate / b.rate
    return statistics.median(tb / ta for ta, tb in zip(a.rounds, b.rounds))


def bracketed(before: Result, after: Result, setting: str) -> Result:
    """One result of two runs of the same loader that bracket others in every round: each
    round's seconds the geometric mean of theirs, which a drift that is linear over the round
    leaves level with the loaders run in between."""
    rounds = tuple(math.sqrt(x * y) for x, y in zip(before.rounds, after.rounds))
    seconds = statistics.median(rounds) if rounds else math.sqrt(before.seconds * after.seconds)
    covered = before.covered and after.covered
    return Result(before.family, setting, before.samples, seconds, covered, before.peer, rounds, before.group)


def time_interleaved(epoch_fns: list[EpochFn], epochs: int) -> list[Timing]:
    """All loaders open at once: a warm-up epoch (0) of each in turn, then ``epochs`` rounds
    that run one epoch of every loader in turn. Load that drifts over the minutes of a run
    (a shared machine) then weighs on every loader alike instead of on whichever ran at the
    time. Returns a ``Timing`` per loader; its rounds are its timed epochs."""
    covered, warm = [], []
    seconds: list[list[float]] = [[] for _ in epoch_fns]
    for epoch in epoch_fns:
        t0 = time.perf_counter()
        covered.append(epoch(0))
        warm.append(time.perf_counter() - t0)
    for e in range(1, epochs + 1):
        for k, epoch in enumerate(epoch_fns):
            t0 = time.perf_counter()
            covered[k] &= epoch(e)
            seconds[k].append(time.perf_counter() - t0)
    return [Timing(c, w, statistics.median(s), tuple(s)) for c, w, s in zip(covered, warm, seconds)]


def time_in_rounds(
    openers: Sequence[Callable[[], AbstractContextManager[EpochFn]]], epochs: int, rounds: int = 3
) -> list[Timing]:
    """Loaders that must not be open at once, each opened ``rounds`` times: every round opens,
    warms up (epoch 0), times ``epochs // rounds`` epochs of and closes each loader in turn, so
    the drift of a shared machine weighs on all of them, as in ``time_interleaved``, though
    only one is open at a time. Returns a ``Timing`` per loader: the median of its timed
    epochs over all rounds, and each round's median."""
    per_round = max(1, epochs // rounds)
    covered, warm = [True] * len(openers), [0.0] * len(openers)
    seconds: list[list[float]] = [[] for _ in openers]
    for r in range(rounds):
        for k, opener in enumerate(openers):
            with opener() as epoch:
                t0 = time.perf_counter()
                covered[k] &= epoch(0)
                warm[k] = warm[k] or time.perf_counter() - t0
                for e in range(1 + r * per_round, 1 + (r + 1) * per_round):  # new epochs each round
                    t0 = time.perf_counter()
                    covered[k] &= epoch(e)
                    seconds[k].append(time.perf_counter() - t0)
    by_round = [
        tuple(statistics.median(s[r * per_round : (r + 1) * per_round]) for r in range(rounds)) for s in seconds
    ]
    return [Timing(c, w, statistics.median(s), b) for c, w, s, b in zip(covered, warm, seconds, by_round)]


def best(results: list[Result], peer: bool) -> Result:
    return max((r for r in results if r.is_peer == peer), key=lambda r: r.rate)


def table(results: list[Result], markdown: bool) -> str:
    peer = best(results, peer=True).rate
    header = ("setting", "samples/s", "vs best peer", "epoch s", "coverage")
    rows = [
        (r.label, f"{r.rate:,.0f}", f"{r.rate / peer:.2f}x", f"{r.seconds:.2f}", "ok" if r.covered else "FAIL")
        for r in results
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 3 + [":---:"]) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]

    def fmt(row) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows])


def coverage_failures(results: list[Result]) -> list[str]:
    bad = [r.label for r in results if not r.covered]
    return ["COVERAGE FAILED: " + ", ".join(bad)] if bad else []


def versions(*distributions: str) -> str:
    """Versions of python, numpy, steadyfeed, keras (with its backend), torch, then of the
    installed ``distributions`` (read from their metadata: nothing more is imported)."""
    import keras
    import torch

    extra = "".join(f", {name} {importlib.metadata.version(name)}" for name in distributions)
    return (
        f"python {platform.python_version()}, numpy {np.__version__}, steadyfeed {steadyfeed.__version__}, "
        f"keras {keras.__version__} (backend {keras.backend.backend()}), torch {torch.__version__}{extra}"
    )


def run_line(markdown: bool, *distributions: str) -> str:
    """Date, cores, platform and versions: the first line a benchmark prints."""
    return (
        f"{'**Run**: ' if markdown else ''}{datetime.date.today().isoformat()}, "
        f"{os.cpu_count()} cores, {platform.platform()}; {versions(*distributions)}"
    )


def heading(title: str, markdown: bool) -> str:
    return f"\n{'### ' if markdown else '== '}{title}\n"


def bullets(lines: list[str], markdown: bool) -> str:
    return "\n".join(("- " if markdown else "") + line for line in lines)


# -- Keras PyDataset, iterated as `fit` iterates it ---------------------------------------
# What `fit` does (keras 3.15.1, trainers/epoch_iterator.py): adapter.on_epoch_begin(),
# which starts the OrderedEnqueuer and with it a fresh thread/process pool every epoch
# (process pools use multiprocessing's default start method, fork on Linux), then iterate
# the adapter's iterator, then adapter.on_epoch_end(), which stops the enqueuer. The
# torch backend wraps the same iterator in a DataLoader(batch_size=None) that converts
# to tensors; get_numpy_iterator() is that iterator without the conversion.
# The timed epoch therefore includes what fit pays per epoch: the pool start and the
# enqueuer's stop(), whose queue drain waits out a 0.1 s get() timeout.
# workers=1 without multiprocessing has no enqueuer: batches are built in the consumer.
@contextmanager
def keras_adapter(dataset) -> Iterator:
    """Keras's own adapter around a ``PyDataset``; stops its enqueuer on exit."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(dataset, shuffle=False)
    try:
        yield adapter
    finally:
        if adapter.enqueuer is not None:
            adapter.enqueuer.stop()


def keras_batches(adapter) -> Iterator:
    """One epoch of ``adapter``'s batches, with the epoch hooks `fit` calls around them."""
    adapter.on_epoch_begin()
    yield from adapter.get_numpy_iterator()
    adapter.on_epoch_end()
