"""Engine throughput: steadyfeed against Keras ``PyDataset`` and torch ``DataLoader``.

One process, the same in-memory arrays and the same per-sample transform for every
loader. Each setting is built once, runs one warm-up epoch (which also starts its
workers) and then one timed epoch (``time.perf_counter``; ``--epochs K``: the median of
K timed epochs, steadier on a busy or small machine). Every epoch is checked for
coverage: steadyfeed's ids must be a permutation of ``range(N)``; the peers must
deliver N rows.

Workloads:
  cheap   numpy transform (x * scale + noise, scale and noise drawn from the sample's rng)
  python  GIL-holding pure-Python loop (~0.5 ms per sample, one rng.random() draw)

Run:  .venv/bin/python benchmarks/bench_engine.py [--quick] [--markdown] [--epochs K]

Keras and torch are imported lazily: steadyfeed's process workers are spawned and
re-import this file as ``__mp_main__``, so its top level stays light.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from _common import (
    EpochFn,
    Result,
    Setting,
    best,
    bullets,
    coverage_failures,
    heading,
    keras_adapter,
    keras_batches,
    run_line,
    table,
    time_epochs,
)

import steadyfeed

SEED = 0
SHAPE = (32, 32, 3)
PY_LOOP = 10_000  # ~0.5 ms of pure Python per sample on the reference machine


# -- transforms: module level, so spawned workers can unpickle them by name -----------------
def cheap_transform(sample: dict, rng: np.random.Generator) -> dict:
    scale = np.float32(rng.uniform(0.9, 1.1))
    noise = rng.standard_normal(sample["x"].shape, dtype=np.float32) * np.float32(0.01)
    return {"x": sample["x"] * scale + noise, "y": sample["y"] * scale}


def python_transform(sample: dict, rng: np.random.Generator) -> dict:
    a, acc = rng.random(), 0.0
    for k in range(PY_LOOP):  # holds the GIL throughout
        acc = (acc + k * a) % 1000.0
    shift = np.float32(acc / 1000.0)
    return {"x": sample["x"] + shift, "y": sample["y"] + shift * np.float32(sample["x"].size)}


@dataclass(frozen=True)
class Workload:
    name: str
    transform: Callable
    samples: int
    quick_samples: int
    batch_size: int
    gil_bound: bool  # the process-scaling target applies


WORKLOADS = (
    Workload("cheap numpy transform", cheap_transform, 20_000, 4_000, 64, gil_bound=False),
    Workload("GIL-holding pure-Python transform", python_transform, 3_000, 600, 32, gil_bound=True),
)


def make_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.random((n, *SHAPE), dtype=np.float32)
    return x, x.reshape(n, -1).sum(axis=1, dtype=np.float32)  # the label is a function of the input


def peer_sample(x: np.ndarray, y: np.ndarray, i: int, transform: Callable) -> tuple[np.ndarray, np.ndarray]:
    """What a Keras or torch user writes: one rng per sample, seeded from (seed, index)."""
    out = transform({"x": x[i], "y": y[i]}, np.random.default_rng((SEED, i)))
    return out["x"], out["y"]


# -- one context manager per loader family, each yielding an EpochFn -------------------------
@contextmanager
def steadyfeed_epochs(x, y, wl: Workload, workers: int, mode: str) -> Iterator[EpochFn]:
    source = steadyfeed.ArraySource(x=x, y=y)
    with steadyfeed.Loader(
        source, wl.batch_size, transform=wl.transform, workers=workers, mode=mode, seed=SEED, with_ids=True
    ) as loader:

        def epoch(e: int) -> bool:
            ids = np.concatenate([batch["id"] for batch in loader.epoch(e)])
            return np.array_equal(np.sort(ids), np.arange(len(x)))

        yield epoch


@functools.cache
def keras_dataset_class():
    import keras

    class TransformedPyDataset(keras.utils.PyDataset):
        def __init__(self, x, y, batch_size: int, transform: Callable, **kwargs):
            super().__init__(**kwargs)
            self.x, self.y, self.batch_size, self.transform = x, y, batch_size, transform

        def __len__(self) -> int:
            return math.ceil(len(self.x) / self.batch_size)

        def __getitem__(self, index: int):
            lo, hi = index * self.batch_size, min((index + 1) * self.batch_size, len(self.x))
            xs, ys = zip(*(peer_sample(self.x, self.y, i, self.transform) for i in range(lo, hi)))
            return np.stack(xs), np.stack(ys)

    return TransformedPyDataset


@contextmanager
def keras_epochs(x, y, wl: Workload, workers: int, use_multiprocessing: bool) -> Iterator[EpochFn]:
    # Iterated as `fit` does, pool start and stop included: see _common.keras_adapter.
    dataset = keras_dataset_class()(
        x, y, wl.batch_size, wl.transform, workers=workers, use_multiprocessing=use_multiprocessing
    )
    with keras_adapter(dataset) as adapter:

        def epoch(e: int) -> bool:
            return sum(len(bx) for bx, _ in keras_batches(adapter)) == len(x)

        yield epoch


class TorchSamples:
    """Map-style dataset (torch only needs __len__ and __getitem__)."""

    def __init__(self, x, y, transform: Callable):
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return peer_sample(self.x, self.y, i, self.transform)


@contextmanager
def torch_epochs(x, y, wl: Workload, workers: int) -> Iterator[EpochFn]:
    from torch.utils.data import DataLoader

    # torch takes any object with __len__ and __getitem__; its annotation asks for its Dataset class
    loader: DataLoader = DataLoader(
        TorchSamples(x, y, wl.transform),  # type: ignore[arg-type]
        batch_size=wl.batch_size,
        num_workers=workers,
        persistent_workers=workers > 0,
    )

    def epoch(e: int) -> bool:
        return sum(len(bx) for bx, _ in loader) == len(x)  # noqa: F821 - the enclosing function's, deleted only after the last epoch

    try:
        yield epoch
    finally:
        del loader  # persistent workers shut down with their iterator


SETTINGS: tuple[Setting, ...] = (
    ("steadyfeed", "thread w0", steadyfeed_epochs, dict(workers=0, mode="thread")),
    ("steadyfeed", "thread w1", steadyfeed_epochs, dict(workers=1, mode="thread")),
    ("steadyfeed", "thread w2", steadyfeed_epochs, dict(workers=2, mode="thread")),
    ("steadyfeed", "process w1", steadyfeed_epochs, dict(workers=1, mode="process")),
    ("steadyfeed", "process w2", steadyfeed_epochs, dict(workers=2, mode="process")),
    # Keras before torch: its process pools fork, and are best forked before torch ops ran.
    ("keras", "PyDataset w1", keras_epochs, dict(workers=1, use_multiprocessing=False)),
    ("keras", "PyDataset w2 threads", keras_epochs, dict(workers=2, use_multiprocessing=False)),
    ("keras", "PyDataset w2 processes", keras_epochs, dict(workers=2, use_multiprocessing=True)),
    ("torch", "DataLoader w0", torch_epochs, dict(workers=0)),
    ("torch", "DataLoader w2 persistent", torch_epochs, dict(workers=2)),
)


def run_setting(family: str, label: str, runner, kwargs: dict, x, y, wl: Workload, epochs: int) -> Result:
    with runner(x, y, wl, **kwargs) as epoch:
        covered, seconds = time_epochs(epoch, epochs)  # a warm-up epoch (starts workers), then the timed ones
    return Result(family, label, len(x), seconds, covered)


def verdicts(wl: Workload, results: list[Result]) -> list[str]:
    by_label = {(r.family, r.setting): r for r in results}
    ours, theirs = best(results, peer=False), best(results, peer=True)
    ratio = ours.rate / theirs.rate
    lines = [
        f"steadyfeed best ({ours.setting}) / peer best ({theirs.family} {theirs.setting}): "
        f"{ratio:.2f}x (target >= 1.0: {'met' if ratio >= 1.0 else 'MISSED'})"
    ]
    if wl.gil_bound:
        scaling = by_label["steadyfeed", "process w2"].rate / by_label["steadyfeed", "process w1"].rate
        lines.append(
            f"steadyfeed process w2 / process w1: {scaling:.2f}x "
            f"(target >= 1.7x: {'met' if scaling >= 1.7 else 'MISSED'})"
        )
    return lines + coverage_failures(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller datasets, for a smoke run")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per setting; reports the median")
    args = parser.parse_args()
    print(run_line(args.markdown))
    for wl in WORKLOADS:
        n = wl.quick_samples if args.quick else wl.samples
        x, y = make_data(n)
        results = [run_setting(*setting, x, y, wl, args.epochs) for setting in SETTINGS]
        timed = "1 timed epoch" if args.epochs == 1 else f"median of {args.epochs} timed epochs"
        title = f"{wl.name}: {n:,} samples of float32 {SHAPE}, batch {wl.batch_size}, {timed}"
        print(heading(title, args.markdown))
        print(table(results, args.markdown))
        print()
        print(bullets(verdicts(wl, results), args.markdown))


if __name__ == "__main__":
    main()
