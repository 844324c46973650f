"""A keyed bijection of ``range(n)`` evaluated at any positions, in constant memory.

:class:`Permutation` is a Feistel network on the grid ``Z_a x Z_b`` (``a = ceil(sqrt(n))``,
``b = ceil(n / a)``, so ``a * b < n + a``; the numeric Feistel of format-preserving
encryption): each round adds a keyed hash of one half to the other, modulo its size,
alternating halves. A value that lands outside ``range(n)`` is encrypted again until it
lands inside (cycle walking), which a grid this tight makes rare (a share under
``1 / sqrt(n)`` of the values, and one extra pass for those). Guarantees:

* **bijective**: ``take(arange(n))`` is a permutation of ``arange(n)`` for every key (each
  round is invertible whatever its hash, and cycle walking restricts a bijection of the
  grid to ``range(n)`` as a bijection);
* **random access**: ``take(positions)`` depends on (key, n, positions) alone, costs a few
  numpy operations on the positions given (no array of size ``n`` is ever built), and is
  vectorised: a batch of 64 positions costs tens of microseconds;
* **well mixed**: ten rounds (sixteen up to 2**20 values) keyed through the splitmix64 finalizer give
  positions indistinguishable
  from uniform and no correlation between neighbouring values (``tests/test_permutation.py``
  checks both with fixed keys);
* **invertible** in the same cost: ``positions_of(values)`` runs the rounds backwards (and
  walks the cycle backwards), so where a given value lies is found without the permutation;
* the key is hashed from integer words (``SeedSequence``), so (seed, epoch) and
  (seed + 1, epoch - 1) give unrelated permutations.

Pure numpy arithmetic on uint64 (wrapping multiplication), so the same key gives the same
permutation on every machine and numpy version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ROUNDS = 10  # as FF1; grids of up to SMALL cells get SMALL_ROUNDS, where a round mixes fewer values
SMALL, SMALL_ROUNDS = 2**20, 16
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
MAX_ITEMS = 2**62  # int64 positions and ids; the grid's cells (< n + sqrt(n) + 2) fit in uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every output bit depends on every input bit."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _mod(x: np.ndarray, m: np.uint64) -> np.ndarray:
    """``x % m``, exactly: numpy divides uint64 by one value several times faster than it takes
    the remainder (4,096 values: 7 us against 52), and a round takes one of each half."""
    return x - (x // m) * m


def _add_mod(x: np.ndarray, y: np.ndarray, m: np.uint64) -> np.ndarray:
    """``(x + y) % m`` for ``x`` below ``m`` and ``y`` at most ``m`` (< 2**63): the sum less
    ``m`` where it reaches ``m``, found as the smaller of the two (below ``m``, the difference
    wraps around)."""
    total = x + y
    return np.minimum(total, total - m)


class Permutation:
    """A bijection of ``range(n)`` keyed by ``key`` (integer words, e.g. ``(seed, stream, epoch)``)."""

    def __init__(self, n: int, key: Sequence[int]):
        n = int(n)
        if not 0 <= n <= MAX_ITEMS:
            raise ValueError(f"a permutation covers 0 to 2**62 items, got {n}")
        self.n = n
        a = max(2, math.isqrt(max(n - 1, 0)) + 1)  # ceil(sqrt(n)), at least 2
        self._a, self._b = np.uint64(a), np.uint64(max(2, -(-n // a)))
        words = [int(w) for w in key]
        if any(w < 0 for w in words):
            raise ValueError(f"key words must be non-negative integers, got {words}")
        rounds = SMALL_ROUNDS if n <= SMALL else ROUNDS
        self._keys = np.random.SeedSequence(words).generate_state(rounds, np.uint64)

    def __len__(self) -> int:
        return self.n

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        a, b = self._a, self._b
        left = x // b
        right = x - left * b  # x = left * b + right, left < a, right < b
        for r, k in enumerate(self._keys):
            if r % 2 == 0:
                left = _add_mod(left, _mod(_mix(right ^ k), a), a)
            else:
                right = _add_mod(right, _mod(_mix(left ^ k), b), b)
        return left * b + right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        """The inverse of ``_encrypt``: the rounds backwards, each subtracting what it added."""
        a, b = self._a, self._b
        left = x // b
        right = x - left * b
        for r in reversed(range(len(self._keys))):
            k = self._keys[r]
            if r % 2 == 0:
                left = _add_mod(left, a - _mod(_mix(right ^ k), a), a)
            else:
                right = _add_mod(right, b - _mod(_mix(left ^ k), b), b)
        return left * b + right

    def positions_of(self, values) -> np.ndarray:
        """The positions holding ``values`` (each in ``range(n)``): ``take(positions_of(v)) == v``."""
        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.n):
            raise IndexError(f"values must lie in range({self.n})")
        if self.n <= 1:
            return values.copy()
        x = self._decrypt(values.astype(np.uint64).reshape(-1))
        outside = np.flatnonzero(x >= self.n)
        while outside.size:  # the cycle walked backwards: out-of-range cells are passed through
            walked = self._decrypt(x[outside])
            x[outside] = walked
            outside = outside[walked >= self.n]
        return x.astype(np.int64).reshape(values.shape)

    def take(self, positions) -> np.ndarray:
        """The values at ``positions`` (int64 array, each in ``range(n)``), as int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"positions must lie in range({self.n})")
        if self.n <= 1:
            return positions.copy()
        x = self._encrypt(positions.astype(np.uint64).reshape(-1))
        outside = np.flatnonzero(x >= self.n)
        while outside.size:  # cycle walking: rare on a grid of at most n + sqrt(n) cells
            walked = self._encrypt(x[outside])
            x[outside] = walked
            outside = outside[walked >= self.n]
        return x.astype(np.int64).reshape(positions.shape)

    def __repr__(self) -> str:
        return f"Permutation(n={self.n})"
