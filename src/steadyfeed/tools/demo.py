"""The end-to-end demo behind ``make demo`` and ``steadyfeed demo``.

1. Generate a dataset on disk, larger than the memory the loader may hold.
2. Train a small Keras model through steadyfeed (process workers, random augmentation).
3. Audit the loader: every sample exactly once per epoch, labels paired, bit-identical
   batches for any worker count and mode.
4. Show that a corrupt sample is quarantined with its file, not fatal and not silent.
5. Measure throughput per setting and name the bottleneck.

Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from steadyfeed import ArraySource, Loader

HELP = "Generate a dataset, train a Keras model through steadyfeed, audit it and measure it."
EXIT_CODES = "exit codes: 0 every promise held; 1 a check failed; 2 a usage error"
SHAPE = (16, 16, 3)
CLASSES = 4
BATCH = 256


def label_of(x: np.ndarray) -> np.ndarray:
    """The label is a function of the input, so the model learns only if pairs stay intact
    (with mixed-up pairs it cannot beat chance, 25%)."""
    return (x.reshape(len(x), -1).mean(axis=1) > 0).astype(np.int64) + 2 * (x[:, 0, 0, 0] > 0)


def augment(sample: dict, rng: np.random.Generator) -> dict:
    """Random brightness jitter (it keeps the label valid), drawn from the sample's own stream."""
    return {**sample, "x": sample["x"] * np.float32(rng.uniform(0.9, 1.1))}


def pairs_ok(batch: dict) -> np.ndarray:
    """The audit's --check: each row's label still matches its input."""
    return batch["y"] == label_of(batch["x"])


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
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    x = np.lib.format.open_memmap(directory / "x.npy", mode="w+", dtype=np.float32, shape=(n, *SHAPE))
    for lo in range(0, n, 4096):  # written in chunks: the dataset never sits in memory whole
        x[lo : lo + 4096] = rng.standard_normal((min(4096, n - lo), *SHAPE), dtype=np.float32)
    np.save(directory / "y.npy", label_of(x))
    x.flush()
    del x
    return ArraySource(x=np.load(directory / "x.npy", mmap_mode="r"), y=np.load(directory / "y.npy", mmap_mode="r"))


class Report:
    def __init__(self):
        self.failed = 0

    def check(self, ok: bool, what: str) -> None:
        self.failed += not ok
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}")


def train(source: ArraySource, val_source: ArraySource, report: Report, epochs: int) -> None:
    if importlib.util.find_spec("keras") is None:
        print("  (keras is not installed: pip install 'steadyfeed[tf]' or [jax] or [torch] to see training)")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, when it is the backend
    import keras

    from steadyfeed.keras import LoaderMonitor

    with (
        Loader(source, BATCH, shuffle=True, seed=1, transform=augment, workers=2, mode="process") as loader,
        Loader(val_source, BATCH) as val_loader,
    ):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input(SHAPE),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        print(f"  backend {keras.backend.backend()}, {len(source)} training and {len(val_source)} validation samples")
        history = model.fit(
            loader.as_keras(),
            validation_data=val_loader.as_keras(),
            epochs=epochs,
            callbacks=[LoaderMonitor(loader)],
            verbose=1 if sys.stdout.isatty() else 2,
        ).history
    print(
        f"  data wait per epoch: {', '.join(f'{w:.0%}' for w in history['data_wait_fraction'])} of step time; "
        f"{history['data_samples_per_sec'][-1]:,.0f} samples/s"
    )
    report.check(
        history["val_accuracy"][-1] > 0.6,
        f"the model learned (validation accuracy {history['val_accuracy'][-1]:.2f}; chance is 0.25)",
    )


def audit_loader(source: ArraySource, report: Report) -> None:
    from steadyfeed.tools.audit import audit

    loader = Loader(source, BATCH, shuffle=True, seed=1, transform=augment)
    result = audit(loader, epochs=2, settings=[(0, "thread"), (2, "thread"), (2, "process")], check=pairs_ok)
    print("\n".join("  " + line for line in result.table().splitlines()))
    report.check(result.passed, "audit: exactly once, paired, identical across workers 0 / 2 threads / 2 processes")


def resume_matches(source: ArraySource) -> bool:
    def loader(workers, mode):
        return Loader(source, BATCH, shuffle=True, seed=42, transform=augment, workers=workers, mode=mode)

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


def never_silent(source: ArraySource, report: Report) -> None:
    bad = len(source) // 3
    with Loader(CorruptOne(source, bad), BATCH, workers=2, on_error="skip", with_ids=True) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        rows = loader.quarantine_report()
    report.check(
        len(ids) == len(source) - 1 and bad not in ids,
        f"a corrupt sample ({bad}) is skipped, every other sample delivered once",
    )
    report.check(
        [r["sample_id"] for r in rows] == [bad], f"and quarantined: {rows[0]['error_type']} at {rows[0]['location']}"
    )
    report.check(resume_matches(source), "a run stopped after 7 batches resumes exactly, in another mode")


def throughput(source: ArraySource) -> None:
    from steadyfeed.tools.bench import bench, grid
    from steadyfeed.tools.bench_command import format_report

    loader = Loader(source, BATCH, shuffle=True, seed=1, transform=augment)
    # five epochs: the window opens once each setting has decided who makes batches (~70 of
    # them), and lasts long enough for a CPU figure
    result = bench(loader, grid([0, 2], ["thread", "process"]), epochs=5, max_batches=200)
    print("\n".join("  " + line for line in format_report(result.as_dict()).splitlines()[2:]))


def add_arguments(parser) -> None:
    parser.add_argument("--samples", type=int, default=20000, help="dataset size (default 20000)")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the dataset (default: a temp dir)")


def run(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp)
        source = generate(directory / "train", args.samples)
        val_source = generate(directory / "val", max(args.samples // 10, BATCH), seed=1)
        dataset_mb = source.arrays["x"].nbytes / 2**20
        held_mb = 4 * BATCH * np.prod(SHAPE) * 4 / 2**20  # prefetch (2 x 2 workers) batches at most
        print(
            f"steadyfeed demo: {len(source)} samples, {dataset_mb:.0f} MB on disk (memory-mapped); "
            f"the loader holds at most {held_mb:.0f} MB of batches"
        )
        report = Report()
        print("\n1. Train a Keras model through steadyfeed (2 process workers, random augmentation)")
        train(source, val_source, report, args.epochs)
        print("\n2. Audit: is every sample delivered exactly once, paired, identically for any workers?")
        audit_loader(source, report)
        print("\n3. Never silent, never stuck")
        never_silent(source, report)
        print("\n4. Throughput")
        throughput(source)
        print(f"\n{'ALL CHECKS PASSED' if not report.failed else f'{report.failed} CHECK(S) FAILED'}")
        return 1 if report.failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
