"""ArraySource: in-memory (or memory-mapped) arrays of equal length."""
from __future__ import annotations

import numpy as np


class ArraySource:
    """Serves ``{name: array[i]}`` for arrays that share their first dimension.

    >>> src = ArraySource(x=np.zeros((10, 3)), y=np.arange(10))
    >>> sorted(src[4])
    ['x', 'y']
    """

    def __init__(self, **arrays):
        if not arrays:
            raise ValueError("ArraySource needs at least one named array, e.g. ArraySource(x=..., y=...)")
        self.arrays = {name: np.asarray(a) if not isinstance(a, np.ndarray) else a for name, a in arrays.items()}
        lengths = {name: (a.shape[0] if a.ndim else None) for name, a in self.arrays.items()}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(f"ArraySource arrays must have the same first dimension, got {lengths}")
        self._len = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._len:
            raise IndexError(f"sample id {i} out of range for ArraySource of length {self._len}")
        return {name: a[i] for name, a in self.arrays.items()}

    def read_many(self, ids) -> list[dict]:
        ids = np.asarray(ids, dtype=np.int64)
        columns = {name: a[ids] for name, a in self.arrays.items()}  # one gather per array
        return [{name: col[k] for name, col in columns.items()} for k in range(len(ids))]

    def locate(self, i: int) -> str:
        return f"ArraySource row {i}"

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={a.dtype}{list(a.shape)}" for k, a in self.arrays.items())
        return f"ArraySource({shapes})"
