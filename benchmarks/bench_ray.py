"""mode="ray" against thread and process mode: JPEG throughput and per-batch overhead.

Workloads (both read the same way in every mode; only the pool differs):
  jpeg   ImageFolder over N generated 128x128 JPEGs in two class folders (decode + stack)
  noop   a source whose samples are one float: what remains is the engine's own cost per batch

Settings: thread w2, process w2, ray w1 on a 1-CPU local cluster, ray w2 on a 2-CPU local
cluster (each Ray setting starts and shuts down its own ``ray.init``). Each setting builds
its loader once, runs one warm-up epoch (starting its workers) and times ``--epochs`` more
(median). Every timed epoch is checked for coverage (ids are a permutation of range(N)).

Run:  .venv/bin/python benchmarks/bench_ray.py [--images 1500] [--epochs 3] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import steadyfeed

BATCH = 32


class NoopSource:
    """Module level so spawned processes and Ray actors can rebuild it."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": np.float32(i)}


def make_jpegs(root: str, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        folder = os.path.join(root, f"class_{i % 2}")
        os.makedirs(folder, exist_ok=True)
        base = rng.integers(0, 255, size=(16, 16, 3), dtype=np.uint8)  # smooth-ish, so JPEG sizes are realistic
        img = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))
        Image.fromarray(img).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def time_loader(loader, n: int, epochs: int) -> float:
    """Median seconds per epoch after one warm-up epoch; checks exactly-once coverage."""
    list(loader.epoch(0))
    times = []
    for e in range(1, epochs + 1):
        t0 = time.perf_counter()
        ids = np.concatenate([b["id"] for b in loader.epoch(e)])
        times.append(time.perf_counter() - t0)
        assert sorted(ids.tolist()) == list(range(n)), "coverage broken"
    return statistics.median(times)


def run_setting(source, mode: str, workers: int, epochs: int, ray_cpus: int | None) -> float:
    if ray_cpus is not None:
        import steadyfeed.ray as sfr

        sfr.init(num_cpus=ray_cpus, log_to_driver=False)
    try:
        with steadyfeed.Loader(source, BATCH, shuffle=True, workers=workers, mode=mode, with_ids=True) as loader:
            return time_loader(loader, len(source), epochs)
    finally:
        if ray_cpus is not None:
            import ray

            ray.shutdown()


SETTINGS = [  # (label, mode, workers, local Ray CPUs)
    ("inline w0", "thread", 0, None),
    ("thread w2", "thread", 2, None),
    ("process w2", "process", 2, None),
    ("ray w1 (1 CPU)", "ray", 1, 1),
    ("ray w2 (2 CPUs)", "ray", 2, 2),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--noop", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        make_jpegs(root, args.images)
        workloads = {"jpeg": steadyfeed.ImageFolder(root), "noop": NoopSource(args.noop)}
        rows = []
        for label, mode, workers, cpus in SETTINGS:
            secs = {name: run_setting(src, mode, workers, args.epochs, cpus) for name, src in workloads.items()}
            rows.append((label, secs))
            print(f"# {label}: " + ", ".join(f"{k} {v:.3f}s" for k, v in secs.items()), flush=True)
    report(rows, args)


def report(rows, args) -> None:
    n_img, n_noop = args.images, args.noop
    batches_noop = -(-n_noop // BATCH)
    inline_noop = rows[0][1]["noop"]
    print(f"\nJPEG: {n_img} images 128x128 (2 classes), batch {BATCH}; no-op: {n_noop} one-float samples "
          f"({batches_noop} batches); median of {args.epochs} timed epochs after a warm-up\n")
    print("| setting | JPEG samples/s | JPEG epoch s | no-op samples/s | no-op ms per batch | overhead vs inline, ms per batch |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, secs in rows:
        per_batch = secs["noop"] / batches_noop * 1e3
        over = (secs["noop"] - inline_noop) / batches_noop * 1e3
        print(f"| {label} | {n_img / secs['jpeg']:,.0f} | {secs['jpeg']:.2f} | {n_noop / secs['noop']:,.0f} "
              f"| {per_batch:.2f} | {over:+.2f} |")


if __name__ == "__main__":
    main()
