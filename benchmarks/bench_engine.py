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
import datetime
import functools
import math
import os
import platform
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

import steadyfeed

os.environ["KERAS_BACKEND"] = "torch"  # only torch is installed as a Keras backend here

SEED = 0
SHAPE = (32, 32, 3)
PY_LOOP = 10_000  # ~0.5 ms of pure Python per sample on the reference machine

EpochFn = Callable[[int], bool]  # runs epoch e, returns whether it covered every sample


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


@dataclass
class Result:
    family: str  # "steadyfeed", "keras" or "torch"
    setting: str
    samples: int
    seconds: float
    covered: bool

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def is_peer(self) -> bool:
        return self.family != "steadyfeed"


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
    with steadyfeed.Loader(source, wl.batch_size, transform=wl.transform, workers=workers, mode=mode,
                           seed=SEED, with_ids=True) as loader:
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
    # What `fit` does (keras 3.15.1, trainers/epoch_iterator.py): adapter.on_epoch_begin(),
    # which starts the OrderedEnqueuer and with it a fresh thread/process pool every epoch
    # (process pools use multiprocessing's default start method, fork on Linux), then iterate
    # the adapter's iterator, then adapter.on_epoch_end(), which stops the enqueuer. The
    # torch backend wraps the same iterator in a DataLoader(batch_size=None) that converts
    # to tensors; get_numpy_iterator() is that iterator without the conversion.
    # The timed epoch therefore includes what fit pays per epoch: the pool start and the
    # enqueuer's stop(), whose queue drain waits out a 0.1 s get() timeout.
    # workers=1 without multiprocessing has no enqueuer: batches are built in the consumer.
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    dataset = keras_dataset_class()(x, y, wl.batch_size, wl.transform, workers=workers,
                                    use_multiprocessing=use_multiprocessing)
    adapter = PyDatasetAdapter(dataset, shuffle=False)

    def epoch(e: int) -> bool:
        adapter.on_epoch_begin()
        rows = sum(len(bx) for bx, _ in adapter.get_numpy_iterator())
        adapter.on_epoch_end()
        return rows == len(x)

    try:
        yield epoch
    finally:
        if adapter.enqueuer is not None:
            adapter.enqueuer.stop()


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

    loader = DataLoader(TorchSamples(x, y, wl.transform), batch_size=wl.batch_size, num_workers=workers,
                        persistent_workers=workers > 0)

    def epoch(e: int) -> bool:
        return sum(len(bx) for bx, _ in loader) == len(x)

    try:
        yield epoch
    finally:
        del loader  # persistent workers shut down with their iterator


SETTINGS = (  # (family, label, runner, keyword arguments)
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
        covered = epoch(0)  # warm-up: starts workers, touches the data
        seconds = []
        for e in range(1, epochs + 1):
            t0 = time.perf_counter()
            covered &= epoch(e)
            seconds.append(time.perf_counter() - t0)
    return Result(family, label, len(x), statistics.median(seconds), covered)


def best(results: list[Result], peer: bool) -> Result:
    return max((r for r in results if r.is_peer == peer), key=lambda r: r.rate)


def table(results: list[Result], markdown: bool) -> str:
    peer = best(results, peer=True).rate
    header = ("setting", "samples/s", "vs best peer", "epoch s", "coverage")
    rows = [(f"{r.family} {r.setting}", f"{r.rate:,.0f}", f"{r.rate / peer:.2f}x", f"{r.seconds:.2f}",
             "ok" if r.covered else "FAIL") for r in results]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 3 + [":---:"]) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]

    def fmt(row) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows])


def verdicts(wl: Workload, results: list[Result]) -> list[str]:
    by_label = {(r.family, r.setting): r for r in results}
    ours, theirs = best(results, peer=False), best(results, peer=True)
    ratio = ours.rate / theirs.rate
    lines = [f"steadyfeed best ({ours.setting}) / peer best ({theirs.family} {theirs.setting}): "
             f"{ratio:.2f}x (target >= 1.0: {'met' if ratio >= 1.0 else 'MISSED'})"]
    if wl.gil_bound:
        scaling = by_label["steadyfeed", "process w2"].rate / by_label["steadyfeed", "process w1"].rate
        lines.append(f"steadyfeed process w2 / process w1: {scaling:.2f}x "
                     f"(target >= 1.7x: {'met' if scaling >= 1.7 else 'MISSED'})")
    if not all(r.covered for r in results):
        lines.append("COVERAGE FAILED: " + ", ".join(f"{r.family} {r.setting}" for r in results if not r.covered))
    return lines


def versions() -> str:
    import keras
    import torch

    return (f"python {platform.python_version()}, numpy {np.__version__}, steadyfeed {steadyfeed.__version__}, "
            f"keras {keras.__version__} (backend {keras.backend.backend()}), torch {torch.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller datasets, for a smoke run")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per setting; reports the median")
    args = parser.parse_args()
    print(f"{'**Run**: ' if args.markdown else ''}{datetime.date.today().isoformat()}, "
        f"{os.cpu_count()} cores, {platform.platform()}; {versions()}")
    for wl in WORKLOADS:
        n = wl.quick_samples if args.quick else wl.samples
        x, y = make_data(n)
        results = [run_setting(*setting, x, y, wl, args.epochs) for setting in SETTINGS]
        timed = "1 timed epoch" if args.epochs == 1 else f"median of {args.epochs} timed epochs"
        title = f"{wl.name}: {n:,} samples of float32 {SHAPE}, batch {wl.batch_size}, {timed}"
        print(f"\n{'### ' if args.markdown else '== '}{title}\n")
        print(table(results, args.markdown))
        print()
        print("\n".join(("- " if args.markdown else "") + line for line in verdicts(wl, results)))


if __name__ == "__main__":
    main()
