"""Loaders for tests/test_cli_audit.py: a good one, and one per fault the audit must catch.

Module-level, so that process workers unpickle them by reference (the audit puts this
file's directory on sys.path, which spawned workers inherit).
"""

import numpy as np

from steadyfeed import ArraySource, Loader, ShuffleSampler

N = 96
BATCH = 16


def label_of(x: np.ndarray) -> np.ndarray:
    """y = f(x), invariant under any permutation of x's values."""
    return x.sum(axis=-1) * 3 + 1


def rows(ids) -> ArraySource:
    x = np.stack([np.arange(i * 4, i * 4 + 4, dtype=np.float64) for i in ids])
    return ArraySource(x=x, y=label_of(x))


def roll(sample, rng):
    """A random augmentation that keeps y = f(x) true."""
    return {**sample, "x": np.roll(sample["x"], int(rng.integers(4)))}


def roll_with_global_random(sample, rng):
    """The bug: global np.random instead of the rng given, so results depend on worker count and timing."""
    return {**sample, "x": np.roll(sample["x"], np.random.randint(4))}


def pairs_ok(batch) -> np.ndarray:
    """The --check: one bool per row."""
    return batch["y"] == label_of(batch["x"])


def good():
    return Loader(rows(range(N)), BATCH, shuffle=True, seed=3, transform=roll)


class OmitsOne(ShuffleSampler):
    """A shuffle that loses sample 17."""

    def epoch_order(self, num_items, seed, epoch):
        order = super().epoch_order(num_items, seed, epoch)
        return order[order != 17]


class RepeatsOne(ShuffleSampler):
    """A shuffle that serves sample 5 twice."""

    def epoch_order(self, num_items, seed, epoch):
        return np.append(super().epoch_order(num_items, seed, epoch), 5)


def drops_one():
    return Loader(rows(range(N)), BATCH, sampler=OmitsOne(), transform=roll)


def duplicates_one():
    return Loader(rows(range(N)), BATCH, sampler=RepeatsOne(), transform=roll)


class Wrapped:
    """The good rows behind a source of our own, to get one thing wrong in a subclass."""

    def __init__(self):
        self.inner = rows(range(N))

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.inner[i]


class SwappedLabels(Wrapped):
    """Stored pairs gone wrong: samples 10 and 20 carry each other's label."""

    def __getitem__(self, i):
        sample = self.inner[i]
        return {**sample, "y": self.inner[30 - i]["y"]} if i in (10, 20) else sample


def swaps_labels():
    return Loader(SwappedLabels(), BATCH, shuffle=True)


class MixesPairs(Wrapped):
    """A batched read that hands labels to the wrong rows (single reads are right)."""

    def read_many(self, ids):
        samples = [self.inner[i] for i in ids]
        labels = [s["y"] for s in samples]
        return [{**s, "y": labels[(k + 1) % len(labels)]} for k, s in enumerate(samples)]


def mixes_pairs():
    return Loader(MixesPairs(), BATCH, shuffle=True)


def nondeterministic():
    return Loader(rows(range(N)), BATCH, shuffle=True, transform=roll_with_global_random)


def train():
    return Loader(rows(range(80)), BATCH, shuffle=True)


def validation():
    return rows(range(80, N))


def leaky_validation():
    """Validation that contains three training samples."""
    return rows([*range(80, N), 3, 7, 50])


not_a_source = 42
threshold = 0.5  # not a function


class BrokenSix(Wrapped):
    """Sample 6 is an unreadable file."""

    def __getitem__(self, i):
        if i == 6:
            raise ValueError("truncated file")
        return self.inner[i]

    def locate(self, i):
        return f"/data/<six>/{i}.npy"


def unreadable():
    return Loader(BrokenSix(), BATCH, on_error="skip", max_error_fraction=0.5)
