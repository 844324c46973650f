"""Data and transforms for the Keras scripts: numpy only, module level.

Spawned steadyfeed workers (process mode) unpickle the source and the transform by
reference and import this module, never Keras.
"""

from __future__ import annotations

import numpy as np

from steadyfeed import ArraySource

N_TRAIN, N_VAL, WIDTH, BATCH = 500, 200, 8, 32
_W = np.linspace(-1.0, 1.0, WIDTH).astype(np.float32) + 0.3


def labels_of(x: np.ndarray) -> np.ndarray:
    """The label is a function of the input: a model learns it only if pairs stay intact."""
    return (x @ _W > 0.0).astype(np.float32)[:, None]


def arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, WIDTH)).astype(np.float32)
    return x, labels_of(x)


def train_source(shuffled_labels: bool = False) -> ArraySource:
    x, y = arrays(N_TRAIN, 1)
    if shuffled_labels:
        y = y[np.random.default_rng(2).permutation(len(y))]
    return ArraySource(x=x, y=y)


def val_source() -> ArraySource:
    x, y = arrays(N_VAL, 3)
    return ArraySource(x=x, y=y)


def two_input_source() -> ArraySource:
    x, y = arrays(N_TRAIN, 1)
    return ArraySource(left=x[:, :4], right=x[:, 4:], y=y)


def jitter(sample: dict, rng: np.random.Generator) -> dict:
    """A small random augmentation drawn from the sample's own stream."""
    noise = rng.normal(scale=0.01, size=sample["x"].shape).astype(np.float32)
    return {**sample, "x": sample["x"] + noise}


class FailingSource:
    """The training data, with sample ``bad`` raising (a corrupt file, say)."""

    def __init__(self, bad: int = 77):
        self.inner, self.bad = train_source(), bad

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"corrupt sample {i}")
        return self.inner[i]
