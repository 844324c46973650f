"""mode="ray" against inline, thread and process mode: per-batch overhead, when Ray pays back,
and how long an epoch stalls when a Ray node is lost.

Workloads (read the same way in every mode; only the pool differs):
  noop   a source whose samples are one float: what remains is the engine's own cost per batch
  jpeg   ImageFolder over N generated 128x128 JPEGs in two class folders (decode + stack)
  cpu    samples that each hold the GIL for W µs (a pure-Python loop), at several W: the
         work Ray (or processes) can spread over cores and threads cannot

Settings: inline (workers=0), thread w2, process w2, ray w1 and ray w2 (thread and process with
``inline_when_faster=False``, so their workers make every batch, as Ray's do), all on one local Ray
cluster of 2 CPUs started up front (so Ray's daemons weigh on every setting alike). For each
workload every loader is opened at once and their epochs are interleaved (one warm-up epoch
each, then ``--epochs`` rounds of one epoch per loader, median), so load that drifts over the
run on a shared machine weighs on every setting alike: compare ratios within one run. Every
timed epoch is checked for coverage. The load average is printed before and after.

``--node-loss K`` instead runs K trials on a real two-node cluster on this machine
(``tests/ray_nodes.py``: a head and a second node of 1 CPU each, one actor on each): the
second node's raylet is killed mid-epoch, and the script reports when the loss was acted on,
the longest wait for a batch after the kill, and the epoch's time against one without a kill.

Run:  .venv/bin/python benchmarks/bench_ray.py [--epochs 5]
      .venv/bin/python benchmarks/bench_ray.py --node-loss 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sized

import numpy as np
from _common import time_interleaved

import steadyfeed

BATCH = 32
SETTINGS = [  # (label, mode, workers)
    ("inline w0", "thread", 0),
    ("thread w2", "thread", 2),
    ("process w2", "process", 2),
    ("ray w1", "ray", 1),
    ("ray w2", "ray", 2),
]


class NoopSource:
    """Module level so spawned processes and Ray actors can rebuild it."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": np.float32(i)}


class BusySource(NoopSource):
    """Each sample holds the GIL for about ``us`` microseconds (a Python loop, calibrated once)."""

    def __init__(self, n: int, us: float, loops_per_us: float):
        super().__init__(n)
        self.us, self.loops = us, max(1, int(us * loops_per_us))

    def __getitem__(self, i: int) -> dict:
        acc = 0
        for k in range(self.loops):
            acc += k
        return {"x": np.float32(i + (acc & 1))}


def loops_per_us() -> float:
    n = 200_000
    t0 = time.perf_counter()
    acc = 0
    for k in range(n):
        acc += k
    return n / ((time.perf_counter() - t0) * 1e6)


def make_jpegs(root: str, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        folder = os.path.join(root, f"class_{i % 2}")
        os.makedirs(folder, exist_ok=True)
        base = rng.integers(0, 255, size=(16, 16, 3), dtype=np.uint8)  # smooth-ish, so JPEG sizes are realistic
        img = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))
        Image.fromarray(img).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def epoch_fn(loader, n: int):
    def run(e: int) -> bool:
        ids = np.concatenate([b["id"] for b in loader.epoch(e)])
        return sorted(ids.tolist()) == list(range(n))

    return run


def time_workload(source, epochs: int) -> list[float]:
    """Median epoch seconds per setting, all loaders open and their epochs interleaved."""
    loaders = [
        steadyfeed.Loader(
            source,
            BATCH,
            shuffle=True,
            workers=w,
            mode=m,
            with_ids=True,
            inline_when_faster=False if w and m != "ray" else None,
        )
        for _, m, w in SETTINGS
    ]
    try:
        results = time_interleaved([epoch_fn(lo, len(source)) for lo in loaders], epochs)
    finally:
        for loader in loaders:
            loader.close()
    assert all(t.covered for t in results), "coverage broken"
    return [t.seconds for t in results]


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def throughput(args) -> None:
    import steadyfeed.ray as sfr

    print(f"load average (1/5/15 min) before: {load()} on {os.cpu_count()} cores", flush=True)
    sfr.init(num_cpus=2, log_to_driver=False)
    rate = loops_per_us()
    try:
        with tempfile.TemporaryDirectory() as root:
            make_jpegs(root, args.images)
            workloads: list[tuple[str, Sized]] = [
                ("no-op", NoopSource(args.noop)),
                ("jpeg", steadyfeed.ImageFolder(root)),
            ]
            workloads += [(f"cpu {us:g} µs/sample", BusySource(args.cpu, us, rate)) for us in args.cpu_us]
            rows = []
            for name, source in workloads:
                seconds = time_workload(source, args.epochs)
                rows.append((name, len(source), seconds))
                print(
                    f"# {name}: " + ", ".join(f"{label} {s:.3f}s" for (label, _, _), s in zip(SETTINGS, seconds)),
                    flush=True,
                )
    finally:
        import ray

        ray.shutdown()
    print(f"load average after: {load()}")
    report(rows, args)


def report(rows, args) -> None:
    print(f"\nbatch {BATCH}, shuffled; median of {args.epochs} interleaved epochs after a warm-up each\n")
    labels = [label for label, _, _ in SETTINGS]
    print(
        "| workload | "
        + " | ".join(f"{label} samples/s" for label in labels)
        + " | ray w2 vs inline | ray w2 vs process w2 |"
    )
    print("|---|" + "---:|" * (len(labels) + 2))
    for name, n, seconds in rows:
        rates = [n / s for s in seconds]
        print(
            f"| {name} | "
            + " | ".join(f"{r:,.0f}" for r in rates)
            + f" | {rates[4] / rates[0]:.2f}x | {rates[4] / rates[2]:.2f}x |"
        )
    name, n, seconds = rows[0]
    batches = -(-n // BATCH)
    print(
        "\nno-op, ms per batch (overhead vs inline): "
        + ", ".join(
            f"{label} {s / batches * 1e3:.2f} ({(s - seconds[0]) / batches * 1e3:+.2f})"
            for label, s in zip(labels, seconds)
        )
    )


# -- node loss ------------------------------------------------------------------------
def node_loss(trials: int, n: int) -> None:
    import ray

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from ray_nodes import LocalCluster

    print(f"load average (1/5/15 min) before: {load()} on {os.cpu_count()} cores", flush=True)
    source = NoopSource(n)
    with LocalCluster(head_cpus=1) as cluster:
        rows = []
        for trial in range(trials):
            node = cluster.add_node(1)
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                rows.append(one_loss(cluster, node, source))
            finally:
                ray.shutdown()
            print(f"# trial {trial + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in rows[-1].items()), flush=True)
    print(f"load average after: {load()}")
    print(
        f"\n{trials} trials, {n} samples, batch {BATCH}, 2 actors (one per node), the second node's raylet killed "
        "after batch 20; medians (min-max):\n"
    )
    for key in rows[0]:
        values = [r[key] for r in rows]
        print(f"- {key}: {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")


def one_loss(cluster, node, source) -> dict:
    with steadyfeed.Loader(source, BATCH, workers=2, mode="ray", with_ids=True) as loader:
        pool = loader._ensure_pool()  # both actors placed first, so the kill hits a busy one
        while len(pool.actor_nodes()) < 2:
            pool.wait(0.5)
        t0 = time.monotonic()
        list(loader.epoch(0))
        clean = time.monotonic() - t0
        ids, killed, acted, longest = [], None, None, 0.0
        last = 0.0  # read once a node was killed, by then the last batch's time
        t0 = time.monotonic()
        for i, batch in enumerate(loader.epoch(1)):
            now = time.monotonic()
            ids.append(batch["id"])
            if killed is not None:
                longest = max(longest, now - last)
                if acted is None and pool._lost_nodes:
                    acted = now - killed
            last = now
            if i == 20:
                node.kill_raylet()
                killed = now
        assert sorted(np.concatenate(ids).tolist()) == list(range(len(source))), "coverage broken"
        return {
            "loss acted on (seen at the next batch)": acted if acted is not None else float("nan"),
            "longest wait for a batch": longest,
            "epoch with the kill": time.monotonic() - t0,
            "epoch without": clean,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--noop", type=int, default=8000)
    parser.add_argument("--cpu", type=int, default=960, help="samples of each cpu workload")
    parser.add_argument("--cpu-us", type=float, nargs="+", default=[20, 100, 500])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--node-loss", type=int, default=0, metavar="TRIALS")
    parser.add_argument("--node-loss-samples", type=int, default=40_000)
    args = parser.parse_args()
    if args.node_loss:
        node_loss(args.node_loss, args.node_loss_samples)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
