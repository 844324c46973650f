"""Memory that thread workers make batches in, reused from task to task.

A thread worker that makes each batch in fresh memory makes it in its own glibc arena; the
consumer frees it, the arena hands its top pages back to the kernel (a trim), and the next
batch there faults every page in again. On a 2-core VM reading HDF5 rows, 4 threads took
35 page faults and 132 us of system time a batch, one thread 1.3 and 37 us (measured,
``docs/benchmarks.md``), and 4 threads made batches at 0.56x one thread's pace (0.87x in
reused memory). Reused memory is faulted in once.

A buffer is reused only once the last array made in it (and every view of them) is gone,
which a finalizer reports, as for the shared-memory slots lent by process workers
(``shm.py``): no batch is ever written while any part of it is alive. A consumer that keeps
batches keeps their memory and the workers take new buffers meanwhile; at most ``keep``
buffers wait for reuse, the rest are freed as they come back.
"""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from . import shm

ALIGN = 64  # a buffer starts on a cache line, as a slot's mapping does: shm.layout_of's offsets assume it


class _Recycled(np.ndarray):
    """A buffer's bytes as handed out, never handed out itself: every array carved from it (and
    every view of those) keeps this one alive, and its finalizer gives the buffer back
    (numpy collapses a view's ``base`` only through arrays of the view's own type)."""


class RecycledBuffers:
    """An ``allocate(specs)`` (the source protocol's, ``sources/base.py``) whose arrays lie in
    one reused buffer per call, laid out as in a shared-memory slot (``shm.layout_of``).
    Thread-safe: worker threads take buffers, whichever thread drops a batch gives its back."""

    def __init__(self, keep: int):
        self.keep = keep
        self._free: deque[np.ndarray] = deque()  # buffers (aligned byte arrays) no array uses now

    def __call__(self, specs: dict) -> dict[str, np.ndarray]:
        layout, size = shm.layout_of(specs)
        buffer = self._take(size)
        whole = buffer[:size].view(_Recycled)
        weakref.finalize(whole, self._give_back, buffer).atexit = False
        return {key: view.view(np.ndarray) for key, view in shm.carve(whole, shm.layout_cuts(layout)[1]).items()}

    def _take(self, size: int) -> np.ndarray:
        while True:
            try:
                buffer = self._free.pop()  # the one freed last: the likeliest still in the caches
            except IndexError:
                return _aligned(size)
            if len(buffer) >= size:
                return buffer
            # too small (the tasks grew): dropped, so buffers of the old size do not linger

    def _give_back(self, buffer: np.ndarray) -> None:
        if len(self._free) < self.keep:
            self._free.append(buffer)

    def waiting(self) -> int:
        """Buffers that wait for reuse."""
        return len(self._free)

    def close(self) -> None:
        """Free the buffers waiting, and every one given back from now on."""
        self.keep = 0
        self._free.clear()


def _aligned(size: int) -> np.ndarray:
    """``size`` fresh bytes starting on an ``ALIGN``-byte boundary."""
    raw = np.empty(max(size, 1) + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + max(size, 1)]
