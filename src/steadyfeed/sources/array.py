"""ArraySource: in-memory or memory-mapped arrays of equal length."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import MappedFile, split_rows


def _mapped_file(a: np.ndarray) -> MappedFile | None:
    """A read-only memmap that is a whole mapping (np.load(..., mmap_mode="r")) travels as its path.

    Views of a memmap (slices) keep the parent's offset, so they are not reopened by
    path; they are pickled as data like any other array.
    """
    if not isinstance(a, np.memmap) or a.filename is None or a.mode != "r" or not isinstance(a.base, mmap.mmap):
        return None
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    return MappedFile(a.filename, int(a.offset), a.dtype, tuple(a.shape), order)


class ArraySource:
    """Serves ``{name: array[i]}`` for arrays that share their first dimension.

    Read-only memory maps (``np.load(path, mmap_mode="r")``) are never loaded whole and
    travel to worker processes as their file path, so a dataset larger than memory
    works in ``mode="process"`` too.

    >>> src = ArraySource(x=np.zeros((10, 3)), y=np.arange(10))
    >>> sorted(src[4])
    ['x', 'y']
    """

    def __init__(self, **arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArraySource needs at least one named array, e.g. ArraySource(x=..., y=...)")
        self.arrays = {name: a if isinstance(a, np.ndarray) else np.asarray(a) for name, a in arrays.items()}
        lengths = {name: (a.shape[0] if a.ndim else None) for name, a in self.arrays.items()}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(f"ArraySource arrays must have the same first dimension, got {lengths}")
        length = next(iter(lengths.values()))
        assert length is not None  # checked just above
        self._len: int = length

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._len:
            raise IndexError(f"sample id {i} out of range for ArraySource of length {self._len}")
        return {name: a[i] for name, a in self.arrays.items()}

    def read_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        return {name: a[ids] for name, a in self.arrays.items()}  # one gather per array

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        return split_rows(self.read_batch(ids))

    def locate(self, i: int) -> str:
        return f"ArraySource row {i}"

    def __getstate__(self) -> dict:
        arrays = {name: _mapped_file(a) or a for name, a in self.arrays.items()}
        return {"arrays": arrays, "_len": self._len}

    def __setstate__(self, state: dict) -> None:
        self._len = state["_len"]
        self.arrays = {name: a.open() if isinstance(a, MappedFile) else a for name, a in state["arrays"].items()}

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={a.dtype}{list(a.shape)}" for k, a in self.arrays.items())
        return f"ArraySource({shapes})"
