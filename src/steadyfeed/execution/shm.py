"""Shared-memory transport of batches from worker processes.

Each worker process owns a few *slots*: segments named by the consumer
(``slot_name``) and reused from batch to batch, so a batch costs no segment creation,
no page faults on fresh memory and no unlink. The consumer tells the worker which slot
to write for each task, never one that holds a batch still in use, and names each of a
worker's slots once before it names any again (``ProcessWorker.with_free_slot``), so a
worker's first tasks make all of its slots. A slot grows (unlink, then create bigger under
the same name) when a batch does not fit.

A batch reaches the consumer without a copy: it is *lent*, its arrays views of its slot.
The slot is then named for no task until the last of those arrays (and of any view of them)
is gone, which a finalizer reports (``ConsumerSlots``): a batch is never memory that
is written again while any part of it is alive. At most ``LENT_SLOTS`` of a worker's slots
are lent at once; a batch beyond that (a consumer keeping many batches) is copied out into
fresh memory in the consumer's thread (``inbox.py``), as every batch once was. Lending
needs slots beyond the ``TASKS_PER_WORKER`` in flight; where shared memory has no room for
one, lending stops and batches are copied again (the pool's decision; no pipes needed).

Because the consumer knows every slot name, it unlinks them all when a worker stops
or dies: no segment outlives the loader. A lent batch outlives its segment's name: it holds
the consumer's mapping of the slot, which stays until the batch's last array goes.

A segment's pages are reserved when it is made (``reserve``): shared memory is a tmpfs
(Docker gives containers 64 MB by default), and a page that cannot be backed when first
written kills the writer with SIGBUS. Reserved up front, a shared memory too small for a
slot is a :class:`NoRoom` before any byte is written; the worker then makes that batch in
its own memory and it travels through the pipe instead, and the consumer decides what
follows (``pool.ProcessPool``: fall back to pipes, or raise).
"""

from __future__ import annotations

import errno
import functools
import math
import mmap
import os
import sys
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from ..sources.base import numpy_allocator
from ..units import exact_bytes, human_bytes
from .task import BatchResult, ShippedResult, evolved

try:
    # Private: multiprocessing.shared_memory's own POSIX binding, the only way to unlink a
    # segment by name that SharedMemory() cannot attach (an empty one, see discard) on every
    # POSIX system. tests/test_private_apis.py fails if it goes.
    import _posixshmem
except ImportError:  # Windows: a segment goes away with its last handle, nothing to unlink
    _posixshmem = None

PREFIX = "sf"
# A worker's batches the consumer may hold as views of their slots at once; more are copied. The
# default prefetch window (config.PREFETCH_PER_WORKER, 4 a worker) plus the batch or two a
# training loop holds: with 4, a window full of ready batches in `fit` (a consumer slower than its
# workers) had 1 in 5 of them copied out instead of lent.
LENT_SLOTS = 6
_ALIGN = 64
# Arrays of single bytes (decoded images) start this far past a 64-byte boundary. libjpeg-turbo's
# SIMD colour conversion writes rows that start on a vector boundary with non-temporal stores
# (movntdq: to memory, past the caches) and others with ordinary ones; the consumer reads a batch
# right after it is made, and JPEGs of 128 x 128 decoded into aligned slots took 81 us an image
# against 76 us at any offset off 16 and 32 bytes (numpy's own large arrays start 16 bytes past a
# page, off the 32 bytes the AVX2 path checks, so threads and workers=0 had the faster stores).
# 8 is off both the SSE2 and the AVX2 boundary and keeps any dtype's alignment.
_BYTES_SKEW = 8
PLACE = "/dev/shm" if sys.platform.startswith("linux") else "shared memory"  # where shm_open's segments live
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
FIXES = (
    "give the machine more shared memory (Docker: docker run --shm-size=2g ...; Kubernetes: an emptyDir "
    "volume with medium: Memory mounted at /dev/shm), make batches smaller (batch_size), or use mode='thread'"
)


@dataclass(frozen=True)
class Shortage:
    """Shared memory had ``free`` bytes (of ``total``) when a segment needed ``needed``."""

    needed: int
    free: int
    total: int

    def text(self, what: str) -> str:
        return (
            f"{PLACE} has {human_bytes(self.free)} free (of {human_bytes(self.total)}) but {what} needs "
            f"{exact_bytes(self.needed)}"
        )


class NoRoom(OSError):
    """Raised where a segment is made, before any byte is written: shared memory cannot hold it."""

    def __init__(self, shortage: Shortage):
        super().__init__(errno.ENOSPC, shortage.text("a segment"))
        self.shortage = shortage


def free_bytes() -> int | None:
    """Bytes free in ``/dev/shm`` now (None where that is not where segments live, or unknown)."""
    if PLACE != "/dev/shm":
        return None
    try:
        st = os.statvfs(PLACE)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def reserve(name: str, size: int) -> None:
    """Back every page of segment ``name`` (``size`` bytes) now, or raise :class:`NoRoom`.

    ``posix_fallocate`` on a tmpfs allocates the pages (and undoes a partial allocation when it
    fails), so a later write can no longer find a page missing: that write would be a SIGBUS.
    Where segments cannot be reserved (no ``posix_fallocate``, as on macOS, or a filesystem
    that refuses it), pages are backed as they are written, as shared memory always is."""
    if _posixshmem is None or not hasattr(os, "posix_fallocate"):
        return
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in _FULL:
            st = os.fstatvfs(fd)
            raise NoRoom(Shortage(size, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)) from None
    finally:
        os.close(fd)


def create_reserved(name: str, size: int) -> shared_memory.SharedMemory:
    """A new segment ``name`` of ``size`` bytes with its pages reserved (``reserve``), or NoRoom
    with nothing left behind."""
    try:
        segment = shared_memory.SharedMemory(name=name, create=True, size=size)
    except FileExistsError:
        raise  # someone else's: never unlink it
    except BaseException:
        # SharedMemory unlinks what it made only on an OSError: a Ctrl-C between its shm_open
        # and its ftruncate left an empty segment of this (unique) name behind
        _unlink_name(name)
        raise
    try:
        reserve(segment.name.lstrip("/"), size)
    except BaseException:
        segment.close()
        segment.unlink()
        raise
    return segment


def slot_name(owner_token: str, worker_id: int, slot: int) -> str:
    # short: macOS limits POSIX shared-memory names to 31 characters
    return f"{PREFIX}{owner_token}w{worker_id}s{slot}"


def slot_index(name: str) -> int:
    """``slot``, of the name ``slot_name`` made."""
    return int(name.rsplit("s", 1)[1])


def owner_token() -> str:
    return f"{os.getpid():x}{os.urandom(2).hex()}"


Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]  # (key, dtype, shape, offset) per array


def layout_of(specs: dict) -> tuple[Layout, int]:
    """Where each array lies in a segment: ((key, dtype, shape, offset), ...), and the total size.
    Each starts on a 64-byte boundary, arrays of single bytes ``_BYTES_SKEW`` past one."""
    layout, offset = [], 0
    for key, (shape, dtype) in specs.items():
        dtype = np.dtype(dtype)
        start = offset + (_BYTES_SKEW if dtype.itemsize == 1 else 0)
        layout.append((key, dtype.str, tuple(shape), start))
        end = start + math.prod(shape) * dtype.itemsize
        offset = -(-end // _ALIGN) * _ALIGN
    return tuple(layout), offset


def _views(segment: shared_memory.SharedMemory, layout: Layout) -> dict[str, np.ndarray]:
    return {
        key: np.ndarray(shape, np.dtype(dtype), buffer=segment.buf, offset=offset)
        for key, dtype, shape, offset in layout
    }


class SlotAllocator:
    """An ``allocate(specs)`` for run_batch that places the batch in slot ``name``, or, when
    shared memory has no room for the slot, in the worker's own memory (the batch then travels
    in the result through the pipe, and ``shortage`` says why). ``ship`` makes the message."""

    def __init__(self, slots: WorkerSlots, name: str):
        self._slots, self.name = slots, name
        self.layout: Layout | None = None
        self.shortage: Shortage | None = None

    def __call__(self, specs: dict) -> dict:
        layout, size = layout_of(specs)
        try:
            segment = self._slots.segment(self.name, size)
        except NoRoom as exc:
            self.shortage = exc.shortage
            return numpy_allocator(specs)
        self.layout = layout
        return _views(segment, layout)

    def ship(self, result: BatchResult) -> ShippedResult:
        """The message for ``result``, a result made with this allocator."""
        if self.layout is None or result.arrays is None:  # not in the slot: the arrays, if any, go by pipe
            return ShippedResult(result, None, self.name, self.shortage)
        generation = self._slots.generations[self.name]
        return ShippedResult(evolved(result, arrays=None), self.layout, self.name, generation=generation)


class WorkerSlots:
    """Worker side: the segments this worker writes batches into."""

    def __init__(self):
        self._segments: dict[str, shared_memory.SharedMemory] = {}
        self.generations: dict[str, int] = {}  # how many times each slot was created, so far

    def allocator(self, name: str) -> SlotAllocator:
        return SlotAllocator(self, name)

    def segment(self, name: str, size: int) -> shared_memory.SharedMemory:
        """Slot ``name``, at least ``size`` bytes (reserved); NoRoom when shared memory cannot hold it."""
        segment = self._segments.get(name)
        if segment is not None and segment.size >= size:
            return segment
        if segment is not None:  # too small: replace it under the same name
            del self._segments[name]
            segment.close()
            segment.unlink()
        segment = self._segments[name] = create_reserved(name, max(size, 1))
        self.generations[name] = self.generations.get(name, 0) + 1
        return segment

    def close(self) -> None:
        for segment in self._segments.values():
            segment.close()  # the consumer unlinks
        self._segments.clear()


class _Lent(np.ndarray):
    """A lent batch's bytes, never handed out itself. numpy collapses a view's ``base`` only
    through arrays of the view's own type, so every array of the batch (and every view of
    them) keeps this one alive, and its finalizer runs when the last of them is gone."""


class ConsumerSlots:
    """Consumer side: the slots lent out. A slot is *held* from the moment a task is told to
    write a lent batch into it (``hold``, in the consumer's thread) until the last array of
    that batch is gone, or the batch did not come through the slot (``receive``); a held slot
    is named for no task.

    Each slot is mapped once, when its first batch arrives, and the mapping is kept until the
    slot is discarded: a lent batch's pages are then faulted in once for the pool's life, not
    once per batch (a fresh mapping per batch cost ~110 us more for a consumer that reads a
    1.5 MB batch once). A slot re-created under the same name (grown) is mapped anew: the
    worker numbers its creations (``ShippedResult.generation``). A lent batch's arrays hold a
    buffer export on the mapping, so nothing can unmap it under them: a mapping dropped
    (discarded, or replaced by a newer one) unmaps itself, closing its file descriptor, when
    the last of them goes. So the consumer holds one descriptor per slot it received from,
    plus one per dropped mapping a lent batch still uses."""

    lends = _posixshmem is not None  # elsewhere (Windows) batches are copied out, as SharedMemory maps them

    def __init__(self) -> None:
        self._held: set[str] = set()
        # slots whose lent batch is gone: appended by finalizers, in whichever thread dropped the
        # last array (the cyclic GC included), so behind no lock; drained by ``held``
        self._returned: deque[str] = deque()
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}  # slot -> (its generation, its mapping)
        self._batches: dict[str, int] = {}  # held slot -> the plan's batches its next task writes
        self.lent = 0  # the plan's batches lent so far

    def hold(self, name: str, batches: int = 1) -> None:
        """The task written into slot ``name`` next (of ``batches`` of the plan's batches) is to
        be lent (called before its task is sent)."""
        self._held.add(name)
        self._batches[name] = batches

    def held(self, names) -> set[str]:
        """Those of slots ``names`` that are held."""
        while self._returned:
            self._held.discard(self._returned.popleft())
        return self._held.intersection(names)

    def receive(self, name: str, layout: Layout | None, generation: int = 0) -> dict[str, np.ndarray] | None:
        """The batch in slot ``name`` (as created the ``generation``-th time) at ``layout``: lent
        (views of the slot) when the slot is held, else copied out into fresh arrays. ``layout``
        None (the batch did not come through the slot): nothing, and a hold on the slot ends."""
        if layout is None:
            self._held.discard(name)
            self._batches.pop(name, None)
            return None
        if not self.lends:
            return _copied(name, layout)
        end, cuts = layout_cuts(layout)
        whole = np.frombuffer(self._mapping(name, generation), np.uint8, count=end)
        if name not in self._held:
            return {key: view.copy() for key, view in carve(whole, cuts).items()}
        self.lent += self._batches.pop(name, 1)
        lent = whole.view(_Lent)
        weakref.finalize(lent, self._returned.append, name).atexit = False
        return {key: view.view(np.ndarray) for key, view in carve(lent, cuts).items()}

    def _mapping(self, name: str, generation: int) -> mmap.mmap:
        kept = self._maps.get(name)
        if kept is None or kept[0] != generation:  # a slot re-created is another segment
            kept = self._maps[name] = (generation, _mapped(name))
        return kept[1]

    def discard(self, names) -> None:
        """Unlink slots whose worker stopped or died (whether or not they exist); a batch lent
        from one stays whole until it goes."""
        for name in names:
            self._held.discard(name)
            self._batches.pop(name, None)
            self._maps.pop(name, None)  # unmapped now, or when the last batch lent from it goes
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


def _mapped(name: str) -> mmap.mmap:
    """A new mapping of slot ``name`` (POSIX), with a file descriptor of its own. Arrays made from
    it with ``np.frombuffer`` keep it alive, and it unmaps itself when it is dropped and the
    last of them goes."""
    assert _posixshmem is not None  # only where slots are lent
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _copied(name: str, layout: Layout) -> dict[str, np.ndarray]:
    """The batch in slot ``name`` at ``layout``, copied out into fresh arrays."""
    segment = shared_memory.SharedMemory(name=name)
    try:
        return {key: view.copy() for key, view in _views(segment, layout).items()}
    finally:
        segment.close()


Cuts = tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]  # (key, dtype, shape, start, stop)


@functools.lru_cache(maxsize=64)
def layout_cuts(layout: Layout) -> tuple[int, Cuts]:
    """Where ``layout``'s arrays end, and their byte ranges with parsed dtypes: a worker's batches
    share a few layouts, so they are worked out once, not for every batch received."""
    cuts = tuple(
        (key, np.dtype(dtype), shape, offset, offset + np.dtype(dtype).itemsize * math.prod(shape))
        for key, dtype, shape, offset in layout
    )
    return (cuts[-1][4] if cuts else 0), cuts


def carve(whole: np.ndarray, cuts: Cuts) -> dict[str, np.ndarray]:
    """The arrays of a layout (its ``layout_cuts``) as views of ``whole``: a slot's bytes, or a
    thread worker's buffer (``recycle.py``)."""
    return {key: whole[start:stop].view(dtype).reshape(shape) for key, dtype, shape, start, stop in cuts}


def _unlink_name(name: str) -> None:
    if _posixshmem is None:
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def create_status(name: str) -> shared_memory.SharedMemory:
    """A worker's status segment, reserved: the consumer writes it at once (NoRoom if it cannot)."""
    return create_reserved(f"{PREFIX}{name}", _ALIGN)


def attach_status(name: str) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=name)


def status_cells(segment: shared_memory.SharedMemory) -> np.ndarray:
    """Three float64 cells (aligned 8-byte stores are atomic) for a worker's StatusSlot."""
    return np.ndarray((3,), np.float64, buffer=segment.buf)


def release(segment: shared_memory.SharedMemory) -> None:
    """Close and unlink ``segment``; again after a call that a Ctrl-C interrupted."""
    segment.close()
    try:
        segment.unlink()
    except FileNotFoundError:  # unlinked by that call
        pass
