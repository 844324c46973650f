"""ArraySource: in-memory or memory-mapped arrays of equal length."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Allocator, MappedFile, split_rows


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

    def read_batch(self, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None) -> dict[str, np.ndarray]:
        """One gather per array, into the arrays ``allocate`` gives (the source protocol's,
        ``sources/base.py``: in process mode, the batch's shared-memory slot) when given."""
        ids = np.asarray(ids, dtype=np.int64)
        if allocate is None:
            return {name: a[ids] for name, a in self.arrays.items()}
        if len(ids) and not (-self._len <= ids.min() and ids.max() < self._len):
            bad = ids[(ids < -self._len) | (ids >= self._len)][0]
            raise IndexError(f"sample id {int(bad)} out of range for ArraySource of length {self._len}")
        out = allocate({name: ((len(ids), *a.shape[1:]), a.dtype) for name, a in self.arrays.items()})
        for name, a in self.arrays.items():
            # checked above: "wrap" reads negative ids as indexing does, and unlike "raise" does
            # not gather into a temporary first
            np.take(a, ids, axis=0, out=out[name], mode="wrap")
        return out

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
