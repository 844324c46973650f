"""The end-to-end demo behind ``make demo``: generate a dataset on disk, feed it through
the loader in every execution mode, and check what steadyfeed promises.

    python -m steadyfeed.tools.demo [--samples 20000] [--dir PATH]

Exit code 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from steadyfeed import ArraySource, Loader

SHAPE = (16, 16, 3)
SETTINGS = [(0, "thread"), (2, "thread"), (2, "process")]


def label_of(x: np.ndarray) -> np.ndarray:
    """The label is a function of the input, so any mix-up of pairs is caught."""
    return (x.reshape(len(x), -1).sum(axis=1) > 0).astype(np.int64) + 2 * (x[:, 0, 0, 0] > 0)


def augment(sample: dict, rng: np.random.Generator) -> dict:
    """A random flip and brightness jitter; the label stays valid because we recompute nothing from x."""
    x = sample["x"][:, ::-1] if rng.random() < 0.5 else sample["x"]
    return {**sample, "x": x * np.float32(rng.uniform(0.9, 1.1))}


class CorruptOne:
    """The demo dataset with one unreadable sample, as a night of real data always has."""

    def __init__(self, inner: ArraySource, bad_id: int):
        self.inner, self.bad_id = inner, bad_id

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.bad_id:
            raise OSError(f"truncated file for sample {i}")
        return self.inner[i]

    def locate(self, i):
        return f"x.npy row {i}"


def generate(directory: Path, n: int, seed: int = 0) -> ArraySource:
    rng = np.random.default_rng(seed)
    x = np.lib.format.open_memmap(directory / "x.npy", mode="w+", dtype=np.float32, shape=(n, *SHAPE))
    for lo in range(0, n, 4096):  # written in chunks: the dataset never sits in memory whole
        x[lo:lo + 4096] = rng.standard_normal((min(4096, n - lo), *SHAPE), dtype=np.float32)
    np.save(directory / "y.npy", label_of(x))
    x.flush()
    del x
    return ArraySource(x=np.load(directory / "x.npy", mmap_mode="r"), y=np.load(directory / "y.npy", mmap_mode="r"))


def run_epochs(source, workers: int, mode: str, epochs: int = 2) -> tuple[list[str], list[np.ndarray], float, bool]:
    digests, orders, paired, samples = [], [], True, 0
    t0 = time.perf_counter()
    with Loader(source, 256, shuffle=True, seed=42, transform=augment, workers=workers, mode=mode,
                with_ids=True) as loader:
        for epoch in range(epochs):
            h, ids = hashlib.sha256(), []
            for batch in loader.epoch(epoch):
                x_raw = source.arrays["x"][batch["id"]]
                paired &= bool(np.array_equal(batch["y"], label_of(x_raw)))
                h.update(batch["x"].tobytes())
                ids.append(batch["id"])
                samples += len(batch["id"])
            digests.append(h.hexdigest())
            orders.append(np.concatenate(ids))
    return digests, orders, samples / (time.perf_counter() - t0), paired


class Report:
    def __init__(self):
        self.failed = 0

    def check(self, ok: bool, what: str) -> None:
        self.failed += not ok
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}")


HELP = "Generate a dataset on disk, feed it through every execution mode, and check every promise."


def add_arguments(parser) -> None:
    parser.add_argument("--samples", type=int, default=20000, help="dataset size (default 20000)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the dataset (default: a temp dir)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        source = generate(directory, args.samples)
        n = len(source)
        print(f"steadyfeed demo: {n} samples of float32{list(SHAPE)} on disk in {directory} (memory-mapped)")
        report = Report()
        results = {s: run_epochs(source, *s) for s in SETTINGS}

        print("\nCorrect")
        ref_digests, ref_orders = results[SETTINGS[0]][:2]
        for (workers, mode), (digests, orders, _, paired) in results.items():
            once = all(sorted(o.tolist()) == list(range(n)) for o in orders)
            report.check(once and paired, f"workers={workers} {mode:7s}: every id exactly once per epoch, labels paired")
            if (workers, mode) != SETTINGS[0]:
                report.check(digests == ref_digests, f"workers={workers} {mode:7s}: batches bit-identical to workers=0")
        report.check(ref_digests[0] != ref_digests[1], "epochs differ (fresh shuffle and augmentation per epoch)")
        report.check(_resume_matches(source), "resume after 7 batches into process mode continues exactly")

        print("\nNever silent")
        bad = n // 3
        with Loader(CorruptOne(source, bad), 256, workers=2, on_error="skip", with_ids=True) as loader:
            ids = np.concatenate([b["id"] for b in loader])
            report_rows = loader.quarantine_report()
        report.check(len(ids) == n - 1 and bad not in ids, f"a corrupt sample ({bad}) is skipped, the rest delivered once")
        report.check([r["sample_id"] for r in report_rows] == [bad],
                     f"and quarantined: {report_rows[0]['error_type']} at {report_rows[0]['location']}")

        print("\nThroughput (2 epochs, batch 256, random flip + jitter)")
        print(f"  {'setting':22s} {'samples/s':>12s}")
        for (workers, mode), (_, _, rate, _) in results.items():
            print(f"  {f'workers={workers} {mode}':22s} {rate:12,.0f}")
        print(f"\n{'ALL CHECKS PASSED' if not report.failed else f'{report.failed} CHECK(S) FAILED'}")
        return 1 if report.failed else 0


def _resume_matches(source) -> bool:
    def loader(workers, mode):
        return Loader(source, 256, shuffle=True, seed=42, transform=augment, workers=workers, mode=mode)

    with loader(2, "thread") as a:
        full = list(a.epoch(0))
    with loader(2, "thread") as a:
        it = iter(a)
        for _ in range(7):
            next(it)
        it.close()
        state = a.state_dict()
    with loader(2, "process") as b:
        b.load_state_dict(state)
        rest = list(b)
    return len(rest) == len(full) - 7 and all(np.array_equal(r["x"], f["x"]) for r, f in zip(rest, full[7:]))


if __name__ == "__main__":
    sys.exit(main())
