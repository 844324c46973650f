"""Shared-memory transport of batches from worker processes.

Each worker process owns a few *slots*: segments named by the consumer
(``slot_name``) and reused from batch to batch, so a batch costs no segment creation,
no page faults on fresh memory and no unlink. The consumer tells the worker which slot
to write for each task, never one that holds a batch not yet copied out; its receiver
thread (``receiver.py``) copies the arrays out into fresh memory (a batch is never a
buffer that is reused later) as soon as the result arrives. A slot grows (unlink, then
create bigger under the same name) when a batch does not fit; the consumer notices by
size and re-attaches.

Because the consumer knows every slot name, it unlinks them all when a worker stops
or dies: no segment outlives the loader.
"""
from __future__ import annotations

import os
import threading
from multiprocessing import shared_memory

import numpy as np

try:
    # Private: multiprocessing.shared_memory's own POSIX binding, the only way to unlink a
    # segment by name that SharedMemory() cannot attach (an empty one, see discard) on every
    # POSIX system. tests/test_private_apis.py fails if it goes.
    import _posixshmem
except ImportError:  # Windows: a segment goes away with its last handle, nothing to unlink
    _posixshmem = None

PREFIX = "sf"
_ALIGN = 64


def slot_name(owner_token: str, worker_id: int, slot: int) -> str:
    # short: macOS limits POSIX shared-memory names to 31 characters
    return f"{PREFIX}{owner_token}w{worker_id}s{slot}"


def owner_token() -> str:
    return f"{os.getpid():x}{os.urandom(2).hex()}"


def layout_of(specs: dict) -> tuple[list, int]:
    """Where each array lies in a segment: [(key, dtype, shape, offset)], and the total size."""
    layout, offset = [], 0
    for key, (shape, dtype) in specs.items():
        dtype = np.dtype(dtype)
        layout.append((key, dtype.str, tuple(shape), offset))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, offset


def _views(segment: shared_memory.SharedMemory, layout: list) -> dict[str, np.ndarray]:
    return {key: np.ndarray(shape, np.dtype(dtype), buffer=segment.buf, offset=offset)
            for key, dtype, shape, offset in layout}


class WorkerSlots:
    """Worker side: the segments this worker writes batches into."""

    def __init__(self):
        self._segments: dict[str, shared_memory.SharedMemory] = {}

    def allocator(self, name: str):
        """An ``allocate(specs)`` for run_batch that places the batch in slot ``name``.

        It records the layout on itself (``allocate.layout``) for the result message.
        """
        def allocate(specs: dict) -> dict:
            layout, size = layout_of(specs)
            allocate.layout = layout  # type: ignore[attr-defined]  # mypy does not model function attributes
            return _views(self._segment(name, size), layout)

        allocate.layout = None  # type: ignore[attr-defined]
        return allocate

    def _segment(self, name: str, size: int) -> shared_memory.SharedMemory:
        segment = self._segments.get(name)
        if segment is not None and segment.size >= size:
            return segment
        if segment is not None:  # too small: replace it under the same name
            segment.close()
            segment.unlink()
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        self._segments[name] = segment
        return segment

    def close(self) -> None:
        for segment in self._segments.values():
            segment.close()  # the consumer unlinks
        self._segments.clear()


class ConsumerSlots:
    """Consumer side: attachments to the workers' slots, kept open between batches."""

    def __init__(self):
        self._attached: dict[str, shared_memory.SharedMemory] = {}
        self._lock = threading.Lock()  # receive runs in the receiver thread, discard in the consumer's

    def receive(self, name: str, layout: list) -> dict[str, np.ndarray]:
        """Copy a batch out of its slot into fresh arrays."""
        need = _end(layout)
        with self._lock:
            segment = self._attached.get(name)
            if segment is None or segment.size < need:  # first use, or the worker grew the slot
                if segment is not None:
                    segment.close()
                segment = self._attached[name] = shared_memory.SharedMemory(name=name)
            return {key: view.copy() for key, view in _views(segment, layout).items()}

    def discard(self, names) -> None:
        """Detach and unlink slots whose worker stopped or died (whether or not they exist)."""
        with self._lock:
            for name in names:
                segment = self._attached.pop(name, None)
                if segment is not None:
                    segment.close()
                try:
                    segment = shared_memory.SharedMemory(name=name)
                except FileNotFoundError:
                    continue
                except ValueError:  # "cannot mmap an empty file"
                    # The worker died between creating the segment and sizing it, so before it
                    # registered it with the resource tracker (and our attach failed before that
                    # too): unlink it by name, or it stays in /dev/shm for good.
                    _unlink_name(name)
                    continue
                segment.close()
                segment.unlink()


def _unlink_name(name: str) -> None:
    if _posixshmem is None:
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _end(layout: list) -> int:
    key, dtype, shape, offset = layout[-1]
    return offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


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
