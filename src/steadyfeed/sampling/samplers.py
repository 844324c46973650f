"""Samplers: which sample ids an epoch visits, in which order.

A sampler is any object with ``epoch_order(num_items, seed, epoch) -> int64 array``
that is a pure function of its arguments, and a ``may_repeat`` flag. The order is
global (the same on every shard); sharding happens afterwards in ``plan.py``.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from .seeds import order_rng


class Sampler(Protocol):
    may_repeat: bool

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray: ...


class SequentialSampler:
    """Ids 0..n-1 in order, every epoch."""

    may_repeat = False

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray:
        return np.arange(num_items, dtype=np.int64)

    def __repr__(self) -> str:
        return "SequentialSampler()"


class ShuffleSampler:
    """A fresh permutation of 0..n-1 per epoch, drawn from (seed, epoch)."""

    may_repeat = False

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray:
        return order_rng(seed, epoch).permutation(num_items).astype(np.int64)

    def __repr__(self) -> str:
        return "ShuffleSampler()"


class WeightedSampler:
    """Draws ``num_samples`` ids per epoch with probability proportional to ``weights``.

    Deterministic: the draw depends only on (seed, epoch). With ``replacement=True``
    (the default) an id may appear several times in an epoch; each appearance gets
    its own random stream for the transform.
    """

    def __init__(self, weights: Sequence[float], num_samples: int | None = None, replacement: bool = True):
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0:
            raise ValueError("weights must be a non-empty 1-D sequence")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError("weights must be finite, non-negative and not all zero")
        self.probabilities = w / w.sum()
        self.num_samples = len(w) if num_samples is None else int(num_samples)
        self.replacement = bool(replacement)
        self.may_repeat = self.replacement
        if not replacement and self.num_samples > int(np.count_nonzero(w)):
            raise ValueError(
                f"cannot draw {self.num_samples} distinct ids: only {np.count_nonzero(w)} have weight > 0"
            )

    @classmethod
    def balanced(cls, labels: Sequence, num_samples: int | None = None) -> "WeightedSampler":
        """Every class is drawn equally often in expectation (weight 1 / class count)."""
        labels = np.asarray(labels)
        _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        return cls(1.0 / counts[inverse], num_samples=num_samples)

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray:
        if num_items != len(self.probabilities):
            raise ValueError(
                f"WeightedSampler has {len(self.probabilities)} weights but the source has {num_items} samples"
            )
        rng = order_rng(seed, epoch)
        ids = rng.choice(num_items, size=self.num_samples, replace=self.replacement, p=self.probabilities)
        return ids.astype(np.int64)

    def __repr__(self) -> str:
        return f"WeightedSampler(n={len(self.probabilities)}, num_samples={self.num_samples}, replacement={self.replacement})"
