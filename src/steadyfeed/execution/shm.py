"""Shared-memory transport of batches from worker processes.

The consumer names every segment before the task leaves (``segment_name``), so it
can always unlink a segment whose worker died or was cancelled: no segment outlives
the loader. The worker creates the segment, collates the batch straight into it and
closes its handle; the consumer copies the arrays out into fresh memory (a batch is
never a buffer that is reused later) and unlinks the segment at once.
"""
from __future__ import annotations

import os
from multiprocessing import shared_memory

import numpy as np

PREFIX = "sf"
_ALIGN = 64


def segment_name(owner_token: str, task_id: int) -> str:
    # short: macOS limits POSIX shared-memory names to 31 characters
    return f"{PREFIX}{owner_token}_{task_id}"


def _offsets(specs: dict) -> tuple[list, int]:
    layout, offset = [], 0
    for key, (shape, dtype) in specs.items():
        dtype = np.dtype(dtype)
        layout.append((key, dtype.str, tuple(shape), offset))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, offset


class SegmentWriter:
    """Worker side: an allocator that places the batch arrays in one new segment."""

    def __init__(self, name: str):
        self.name = name
        self.segment: shared_memory.SharedMemory | None = None
        self.layout: list | None = None

    def __call__(self, specs: dict) -> dict:
        self.layout, size = _offsets(specs)
        self.segment = shared_memory.SharedMemory(name=self.name, create=True, size=max(size, 1))
        return {
            key: np.ndarray(shape, np.dtype(dtype), buffer=self.segment.buf, offset=offset)
            for key, dtype, shape, offset in self.layout
        }

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()  # the consumer unlinks it after copying
            self.segment = None


def receive(name: str, layout: list) -> dict[str, np.ndarray]:
    """Consumer side: copy a batch out of its segment and unlink the segment."""
    segment = shared_memory.SharedMemory(name=name)
    try:
        return {
            key: np.ndarray(shape, np.dtype(dtype), buffer=segment.buf, offset=offset).copy()
            for key, dtype, shape, offset in layout
        }
    finally:
        segment.close()
        segment.unlink()


def discard(name: str) -> None:
    """Unlink a segment that may or may not exist (its worker died or was stopped)."""
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    segment.close()
    segment.unlink()


def create_status(name: str) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=f"{PREFIX}{name}", create=True, size=_ALIGN)


def attach_status(name: str) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=name)


def status_cells(segment: shared_memory.SharedMemory) -> np.ndarray:
    """Three float64 cells (aligned 8-byte stores are atomic) for a worker's StatusSlot."""
    return np.ndarray((3,), np.float64, buffer=segment.buf)


def release(segment: shared_memory.SharedMemory) -> None:
    segment.close()
    segment.unlink()


def owner_token() -> str:
    return f"{os.getpid():x}{os.urandom(2).hex()}"
