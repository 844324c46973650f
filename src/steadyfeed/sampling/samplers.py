"""Samplers: which sample ids an epoch visits, in which order.

A sampler's ``order(num_items, seed, epoch)`` returns an :class:`Order`: the epoch's
global sequence of ids (the same on every shard; sharding happens afterwards in
``plan.py``), evaluated lazily: ``order.take(positions)`` gives the ids at those positions
of the sequence from (seed, epoch, positions) alone, so no array of the epoch's length is
built. ``epoch_order(num_items, seed, epoch)`` is the whole sequence as an int64 array
(for inspection, and the protocol of custom samplers: any object with ``epoch_order``
that is a pure function of its arguments, and a ``may_repeat`` flag, still works; its
array is then what the plan reads).

Memory per epoch: :class:`SequentialSampler` and :class:`ShuffleSampler` keep a few
integers whatever the number of samples; :class:`WeightedSampler` keeps its weights'
cumulative sums (O(N), as the weights themselves) and, without replacement, the ids drawn.

``ORDER_FORMAT`` names how orders are drawn; it is part of every saved loader state, so a
state saved by a version that drew other orders is refused rather than resumed wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .permutation import Permutation, _mix
from .seeds import _check_seed, order_rng

ORDER_FORMAT = "feistel-grid/1"  # Permutation (grid, rounds, keying) and WeightedOrder (uniforms)
_PERMUTATION_STREAM = 3
_WEIGHTED_STREAM = 4


class Order(Protocol):
    """An epoch's ids, evaluated at any positions: ``len(order)`` of them."""

    may_repeat: bool

    def __len__(self) -> int: ...

    def take(self, positions: np.ndarray) -> np.ndarray: ...


class Sampler(Protocol):
    may_repeat: bool

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray: ...


def _positions(positions) -> np.ndarray:
    return np.asarray(positions, dtype=np.int64)


class RangeOrder:
    """Ids 0..n-1 in order."""

    may_repeat = False

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def take(self, positions) -> np.ndarray:
        return _positions(positions).copy()

    def positions_of(self, ids) -> np.ndarray:
        """Where ``ids`` lie (for exclusion, ``exclusion.py``): ids 0..n-1 are their own positions."""
        ids = _positions(ids)
        return ids[(ids >= 0) & (ids < self.n)]


class PermutedOrder:
    """A keyed permutation of 0..n-1 (``permutation.Permutation``)."""

    may_repeat = False

    def __init__(self, permutation: Permutation):
        self.permutation = permutation

    def __len__(self) -> int:
        return len(self.permutation)

    def take(self, positions) -> np.ndarray:
        return self.permutation.take(positions)

    def positions_of(self, ids) -> np.ndarray:
        """Where ``ids`` lie: the inverse permutation, O(len(ids))."""
        ids = _positions(ids)
        return self.permutation.positions_of(ids[(ids >= 0) & (ids < len(self))])


class ArrayOrder:
    """An order given as an array (what a custom sampler's ``epoch_order`` returns)."""

    def __init__(self, ids, may_repeat: bool = False):
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.may_repeat = bool(may_repeat)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, positions) -> np.ndarray:
        return self.ids[_positions(positions)]

    def positions_of(self, ids) -> np.ndarray:
        """Every position holding one of ``ids`` (the array is at hand: one pass over it)."""
        return np.flatnonzero(np.isin(self.ids, _positions(ids)))


def order_of(sampler, num_items: int, seed: int, epoch: int) -> Order:
    """The sampler's lazy order, or its ``epoch_order`` array when it defines its own (a
    custom sampler, or a subclass of a built-in one that overrides ``epoch_order``)."""
    if isinstance(sampler, _LazySampler) and type(sampler).epoch_order is _LazySampler.epoch_order:
        return sampler.order(num_items, seed, epoch)
    return ArrayOrder(sampler.epoch_order(num_items, seed, epoch), getattr(sampler, "may_repeat", False))


class _LazySampler:
    """``epoch_order`` as the whole of ``order``: for inspection and small data."""

    may_repeat = False

    def order(self, num_items: int, seed: int, epoch: int) -> Order:  # pragma: no cover - overridden
        raise NotImplementedError

    def epoch_order(self, num_items: int, seed: int, epoch: int) -> np.ndarray:
        order = self.order(num_items, seed, epoch)
        return order.take(np.arange(len(order), dtype=np.int64))


class SequentialSampler(_LazySampler):
    """Ids 0..n-1 in order, every epoch."""

    def order(self, num_items: int, seed: int, epoch: int) -> Order:
        return RangeOrder(num_items)

    def __repr__(self) -> str:
        return "SequentialSampler()"


def permutation(num_items: int, seed: int, epoch: int) -> Permutation:
    """The permutation ``ShuffleSampler`` gives epoch ``epoch`` under ``seed``."""
    return Permutation(num_items, (_check_seed(seed), _PERMUTATION_STREAM, int(epoch)))


class ShuffleSampler(_LazySampler):
    """A fresh permutation of 0..n-1 per epoch, keyed by (seed, epoch), in constant memory."""

    def order(self, num_items: int, seed: int, epoch: int) -> Order:
        return PermutedOrder(permutation(num_items, seed, epoch))

    def __repr__(self) -> str:
        return "ShuffleSampler()"


class WeightedOrder:
    """Draw ``k`` of an epoch is ``searchsorted(cdf, u_k)``, with ``u_k`` uniform in [0, 1)
    hashed from (key, k): any draw is computed on its own. Ids of weight 0 are never drawn
    (their interval of the cdf is empty)."""

    may_repeat = True

    def __init__(self, cdf: np.ndarray, num_samples: int, key: np.ndarray):
        self.cdf, self.num_samples, self.key = cdf, int(num_samples), key

    def __len__(self) -> int:
        return self.num_samples

    def take(self, positions) -> np.ndarray:
        positions = _positions(positions)
        bits = _mix(_mix(positions.astype(np.uint64) ^ self.key[0]) ^ self.key[1])
        u = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53  # 53 random bits: [0, 1)
        return np.searchsorted(self.cdf, u, side="right").astype(np.int64)


class WeightedSampler(_LazySampler):
    """Draws ``num_samples`` ids per epoch with probability proportional to ``weights``.

    Deterministic: the draw depends only on (seed, epoch). With ``replacement=True``
    (the default) an id may appear several times in an epoch; each appearance gets
    its own random stream for the transform (its ``draw`` is its position in the epoch).
    Keeps O(N) floats (the weights' cumulative sums); each draw is computed on its own.
    """

    def __init__(
        self, weights: Sequence[float] | np.ndarray, num_samples: int | None = None, replacement: bool = True
    ) -> None:
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
            raise ValueError(f"cannot draw {self.num_samples} distinct ids: only {np.count_nonzero(w)} have weight > 0")
        cdf = np.cumsum(self.probabilities)
        cdf[np.flatnonzero(w)[-1] :] = 1.0  # exactly 1 from the last id that can be drawn: none after it is
        self._cdf = cdf

    @classmethod
    def balanced(cls, labels: Sequence | np.ndarray, num_samples: int | None = None) -> WeightedSampler:
        """Every class is drawn equally often in expectation (weight 1 / class count)."""
        labels = np.asarray(labels)
        _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        return cls(1.0 / counts[inverse], num_samples=num_samples)

    def order(self, num_items: int, seed: int, epoch: int) -> Order:
        if num_items != len(self.probabilities):
            raise ValueError(
                f"WeightedSampler has {len(self.probabilities)} weights but the source has {num_items} samples"
            )
        if not self.replacement:  # distinct ids: drawn as a whole (at most N ids, as the weights)
            ids = order_rng(seed, epoch).choice(num_items, size=self.num_samples, replace=False, p=self.probabilities)
            return ArrayOrder(ids, may_repeat=False)
        key = np.random.SeedSequence([_check_seed(seed), _WEIGHTED_STREAM, int(epoch)]).generate_state(2, np.uint64)
        return WeightedOrder(self._cdf, self.num_samples, key)

    def __repr__(self) -> str:
        return f"WeightedSampler(n={len(self.probabilities)}, num_samples={self.num_samples}, replacement={self.replacement})"
