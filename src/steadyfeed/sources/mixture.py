"""Mixture: several sources as one, each sample drawn from a component by weight.

``Mixture([a, b, c], weights=[0.5, 0.3, 0.2])`` is a source of ``length`` samples (default:
the components' total) whose sample ``i`` is a sample of one component. Guarantees:

* **deterministic**: sample ``i`` maps to (component, item) from (weights, seed, i) alone,
  in constant memory and time (a few integer operations per component level), so the
  mixture pickles small, resumes exactly and is the same in every worker and mode;
* **shares hold in every window**: components are interleaved by a balanced binary tree
  of two-way splits, each an exact Beatty sequence (a window of ``n`` positions of a split
  holds ``floor(n p)`` or ``ceil(n p)`` of its left side), so any window of consecutive ids
  holds each component's share to within a few samples (one per tree level): over 10,000
  samples, well within 1 percentage point of its weight;
* **components cycle**: a component's k-th sample is item ``perm_pass(k mod n)`` of pass
  ``k // n``, each pass its own keyed permutation (``sampling/permutation.py``): no item
  repeats before all of its items have appeared, and every pass has a fresh order;
* **named**: ``locate(i)`` names the component (and the component's own location), so a
  failure, the quarantine and ``loader.stats()["components"]`` say which dataset it was.

The mixture already interleaves and shuffles: read it with the loader's default sequential
order to keep the windowed shares in the delivered stream (``shuffle=True`` reorders the
mixture's samples, so shares then hold per epoch and only on average within a window).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..sampling.permutation import Permutation
from .base import check_source, close_source, fingerprint, locate, read_many

_MIX_STREAM = 5
_RESOLUTION = 2**32  # weights become integers of this scale: shares exact to 2**-32
FORMAT = "steadyfeed.mixture/1"


def _integer_weights(weights: Sequence[float], count: int) -> list[int]:
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(w) != count:
        raise ValueError(f"Mixture has {count} sources but {len(w)} weights")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"Mixture weights must be finite, non-negative and not all zero, got {w.tolist()}")
    share = w / w.sum()
    return [max(1, round(s * _RESOLUTION)) if s > 0 else 0 for s in share]


def _tree(components: list[int], weights: list[int]):
    """A leaf (a component index) or ``(left weight, total, left, right)``, halves balanced by count."""
    if len(components) == 1:
        return components[0]
    half = len(components) // 2
    left, right = components[:half], components[half:]
    left_weight = sum(weights[c] for c in left)
    return (left_weight, left_weight + sum(weights[c] for c in right), _tree(left, weights), _tree(right, weights))


class Mixture:
    """One source made of ``sources`` (a list, or a dict of name -> source) drawn by ``weights``
    (default: equal); ``length`` samples (default: the components' total); ``seed`` keys
    each component's passes. See the module docstring for the guarantees."""

    def __init__(
        self,
        sources: Sequence[Any] | Mapping[str, Any],
        weights: Sequence[float] | None = None,
        *,
        length: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(sources, Mapping):
            names, sources = [str(k) for k in sources], list(sources.values())
        else:
            sources = list(sources)
            names = [f"{k}:{type(s).__name__}" for k, s in enumerate(sources)]
        if not sources:
            raise ValueError("Mixture needs at least one source")
        for source in sources:
            check_source(source)
        self.sources, self.names = sources, names
        self.weights = [1.0] * len(sources) if weights is None else [float(w) for w in weights]
        self._integer = _integer_weights(self.weights, len(sources))
        self.sizes = [len(s) for s in sources]
        empty = [names[c] for c, w in enumerate(self._integer) if w and not self.sizes[c]]
        if empty:
            raise ValueError(f"Mixture components {empty} are empty but have weight > 0")
        self.seed = int(seed)
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        self.length = sum(self.sizes) if length is None else int(length)
        if self.length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        drawn = [c for c, w in enumerate(self._integer) if w]
        self._root = _tree(drawn, self._integer)
        self._passes: dict[int, tuple[int, Permutation]] = {}  # component -> its latest pass (a cache)

    @property
    def component_names(self) -> list[str]:
        return list(self.names)

    def __len__(self) -> int:
        return self.length

    def _route(self, i: int) -> tuple[int, int]:
        """(component, how many of its samples come before sample ``i``)."""
        node, j = self._root, i
        while isinstance(node, tuple):
            left_weight, total, left, right = node
            before = (j * left_weight + total // 2) // total  # left-side positions before j
            if ((j + 1) * left_weight + total // 2) // total > before:
                node, j = left, before
            else:
                node, j = right, j - before
        return node, j

    def resolve(self, i: int) -> tuple[int, int]:
        """``(component index, item)``: what sample ``i`` is."""
        i = int(i)
        if not 0 <= i < self.length:
            raise IndexError(f"sample id {i} out of range for a Mixture of length {self.length}")
        component, rank = self._route(i)
        size = self.sizes[component]
        return component, int(self._pass(component, rank // size).take(np.array([rank % size]))[0])

    def _pass(self, component: int, number: int) -> Permutation:
        cached = self._passes.get(component)
        if cached is None or cached[0] != number:
            cached = (number, Permutation(self.sizes[component], (self.seed, _MIX_STREAM, component, number)))
            self._passes[component] = cached
        return cached[1]

    def components_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The component index of each id (for counting per component)."""
        return np.array([self._route(int(i))[0] for i in np.asarray(ids).reshape(-1)], dtype=np.int64)

    def __getitem__(self, i: int) -> Mapping[str, Any]:
        component, item = self.resolve(i)
        return self.sources[component][item]

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list:
        """The samples of ``ids``, read per component in one call each where it offers one."""
        found = [self.resolve(i) for i in ids]
        out: list = [None] * len(found)
        for component in sorted({c for c, _ in found}):
            places = [k for k, (c, _) in enumerate(found) if c == component]
            items = [found[k][1] for k in places]
            source = self.sources[component]
            samples = read_many(source, items) or [source[item] for item in items]
            for k, sample in zip(places, samples):
                out[k] = sample
        return out

    def locate(self, i: int) -> str:
        component, item = self.resolve(i)
        inner = locate(self.sources[component], item)
        return f"component {self.names[component]!r} item {item}" + (f": {inner}" if inner else "")

    def fingerprint(self) -> str:
        """Changes when a component's data, a weight, the length or the seed changes."""
        parts = [
            FORMAT,
            self.names,
            self._integer,
            self.length,
            self.seed,
            [_identity(source) for source in self.sources],
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def close(self) -> None:
        for source in self.sources:
            close_source(source)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_passes": {}}

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={w:g}" for n, w in zip(self.names, self.weights))
        return f"Mixture({parts}, length={self.length}, seed={self.seed})"


def _identity(source: Any) -> list:
    kind = type(source)
    fp = fingerprint(source)
    return [
        f"{kind.__module__}.{kind.__qualname__}",
        fp if fp is not None else re.sub(r" at 0x[0-9a-fA-F]+", "", repr(source)),
    ]
