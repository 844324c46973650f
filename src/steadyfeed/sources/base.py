"""The source protocol and the helpers the engine uses to talk to any source.

A source is any object with ``__len__`` and ``__getitem__(i) -> dict[str, array-like]``;
the sample id is ``i``. Optional extras the engine uses when present:

* ``read_many(ids) -> list[dict]``: one call for a whole batch, when that is cheaper;
* ``read_batch(ids) -> dict[str, array]``: the batch as stacked columns (first dimension
  ``len(ids)``), freshly allocated for the caller to keep (never a buffer the source
  reuses); with no transform the engine uses them as the batch, skipping all per-sample
  work. Sources that offer it get ``read_many`` from
  :func:`split_rows`. A ``read_batch(ids, allocate=None)`` also takes an allocator: given one,
  it calls ``allocate({key: (shape, dtype)})`` once, for every column it returns, and returns
  those arrays filled, so a process worker reads the batch straight into shared memory (see
  :func:`read_columns`);
* ``locate(i) -> str``: where sample ``i`` lives (a file path, a row), for error messages;
* ``close()``: release file handles (called when a worker or the loader shuts down);
* ``fingerprint() -> str``: changes whenever the data may have changed (paths, sizes,
  modification times), so caches and indexes built from the source know when to rebuild.

Sources never hold open handles in their pickled state (see :class:`LazyHandles`), so
they travel to spawned worker processes and reopen there.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import inspect
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

try:
    import resource  # imported now: with no descriptor left, an import could not open its file
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]  # no fd limit to read there


@runtime_checkable
class Source(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Mapping[str, Any]: ...


def as_sample(raw: Any) -> dict[str, np.ndarray]:
    """A sample as the engine and the caches hold it: ``{str key: numpy array}``.

    The one place samples are normalised: a value becomes an array (an array stays the very
    same object unless its byte order is not the machine's: a ``>f4`` array becomes a
    ``float32`` copy, so one big-endian file among native ones batches with them), a key
    becomes a string, and an ``object`` dtype is refused, since its bytes could be neither
    measured, stored without pickle, nor batched."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"a sample must be a dict of arrays, got {type(raw).__name__}")
    sample = {}
    for key, value in raw.items():
        arr = value if type(value) is np.ndarray else np.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError(f"key {key!r} has dtype object; samples must hold numeric or string arrays")
        sample[str(key)] = arr if arr.dtype.isnative else arr.astype(native(arr.dtype))
    return sample


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order (fields and sub-arrays included): the same values,
    the same dtype for every sample whatever byte order its file was written in."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def check_source(source: Any) -> None:
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(f"a source needs __len__ and __getitem__(i) -> dict, got {type(source).__name__}")


def locate(source: Any, sample_id: int) -> str | None:
    """Where a sample lives, if the source can say; never raises."""
    fn = getattr(source, "locate", None)
    if fn is None:
        return None
    try:
        return str(fn(int(sample_id)))
    except Exception:  # a broken locate must not hide the real error
        return None


def read_many(source: Any, ids: Sequence[int] | np.ndarray) -> list[Mapping[str, Any]] | None:
    """The batch via ``source.read_many`` when offered and successful, else None.

    None means "read one by one": a failing batched read is retried per sample so
    that the failure is pinned on the right id and the other samples survive.
    """
    fn = getattr(source, "read_many", None)
    if fn is None or len(ids) == 0:
        return None
    try:
        samples = fn(ids)
    except Exception:
        return None
    return samples if len(samples) == len(ids) else None


def fingerprint(source: Any) -> str | None:
    fn = getattr(source, "fingerprint", None)
    return None if fn is None else str(fn())


def file_fingerprint(paths) -> str:
    """A digest of the paths, sizes and modification times of files (for ``fingerprint()``)."""
    digest = hashlib.sha256()
    for path in paths:
        st = os.stat(path)
        digest.update(f"{os.fspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# allocate(specs) -> {key: empty array}; specs is {key: (shape, dtype)} (read_batch's, and run_batch's)
Allocator = Callable[[dict], dict]


def numpy_allocator(specs: dict) -> dict:
    """The plain ``Allocator``: a new array per ``key: (shape, dtype)``."""
    return {key: np.empty(shape, dtype) for key, (shape, dtype) in specs.items()}


def read_columns(
    source: Any, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None
) -> dict[str, np.ndarray] | None:
    """The batch via ``source.read_batch`` when offered and well-formed, else None; ``allocate``
    is passed on to a ``read_batch`` that takes one (:func:`reads_into`).

    None means "take the per-sample path", which pins any failure on its sample id.
    """
    fn = getattr(source, "read_batch", None)
    if fn is None or len(ids) == 0:
        return None
    try:
        columns = fn(ids, allocate=allocate) if allocate is not None and reads_into(source) else fn(ids)
    except Exception:
        return None
    if not isinstance(columns, Mapping):
        return None
    for column in columns.values():
        if not isinstance(column, np.ndarray) or column.dtype == object or len(column) != len(ids):
            return None
    return dict(columns)


def reads_into(source: Any) -> bool:
    """Whether ``source.read_batch`` takes an ``allocate`` (the source protocol above)."""
    return _takes_allocate(type(source))  # type: ignore[arg-type]  # classes hash


@functools.cache
def _takes_allocate(cls: Any) -> bool:  # a class (Any: mypy reads type[...] as unhashable)
    try:
        return "allocate" in inspect.signature(cls.read_batch).parameters
    except (AttributeError, TypeError, ValueError):  # no such method, or one without a signature
        return False


def pread_fully(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from byte ``offset`` of ``fd`` (a read may return less after a signal);
    returns how many bytes were missing at the end of the file, 0 when ``view`` is full.
    ``pread`` keeps threads off any shared file position."""
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            return len(view)
        view, offset = view[got:], offset + got
    return 0


def split_rows(columns: Mapping[str, np.ndarray]) -> list[dict]:
    """Stacked columns as one dict per sample (views, no copies): ``read_many`` from ``read_batch``."""
    count = len(next(iter(columns.values()))) if columns else 0
    return [{name: column[k] for name, column in columns.items()} for k in range(count)]


def close_source(source: Any) -> None:
    fn = getattr(source, "close", None)
    if fn is not None:
        fn()


NO_FDS = frozenset({errno.EMFILE, errno.ENFILE})  # out of file descriptors


def max_open_handles() -> int:
    """How many handles one :class:`LazyHandles` keeps open: an eighth of this process's
    file-descriptor limit (``ulimit -n``), from 4 to 128."""
    return max(4, min(128, fd_limit()[0] // 8))


def fd_limit() -> tuple[int, int]:
    """This process's file-descriptor limit, (soft, hard); (1024, 1024) where it cannot be asked."""
    if resource is None:
        return 1024, 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (soft if soft != resource.RLIM_INFINITY else 1 << 20), hard


def fd_limit_note() -> str:
    """Why a process ran out of file descriptors and what to do, for messages (EMFILE)."""
    soft, hard = fd_limit()
    try:
        open_now = f", {len(os.listdir('/proc/self/fd')) - 1} are open now"
    except OSError:
        open_now = ""
    held = sum(handles.open_count() for handles in list(_EVERY_HANDLES))
    return (
        f"this process may open {soft} files at once (ulimit -n; hard limit {hard}){open_now}, {held} of them "
        f"steadyfeed's cached file handles (at most {max_open_handles()} per source). Raise "
        f"the limit (ulimit -n 4096 in the shell that starts training, or resource.setrlimit(resource."
        f"RLIMIT_NOFILE, ...) before the loader starts), or hold fewer files open elsewhere"
    )


class _Held:
    __slots__ = ("handle", "users")

    def __init__(self, handle: Any):
        self.handle, self.users = handle, 0


class _InUse:
    """``with handles.use(key) as handle``: a class, not a generator, as sources take a handle
    for every batch (a ``contextlib.contextmanager`` block cost ~5 us more)."""

    __slots__ = ("_handles", "_key", "_held")

    def __init__(self, handles: LazyHandles, key: Any):
        self._handles, self._key = handles, key

    def __enter__(self) -> Any:
        self._held = self._handles._acquire(self._key)
        return self._held.handle

    def __exit__(self, *exc_info: object) -> None:
        self._handles._release(self._held)


class LazyHandles:
    """File handles opened on first use, once per process, shared by that process's threads,
    at most ``max_open`` of them kept open (least recently used closed first).

    A source keeps one of these instead of open files, so it pickles without handles
    (a handle inherited across processes shares its file offset and locks) and every
    worker process reopens what it needs. ``opener(key)`` opens one handle; handles
    must be safe to share between threads (e.g. read with ``os.pread``, or h5py,
    which serializes its calls). Reads take a handle for as long as they need it::

        with self._handles.use(path) as fd:
            data = os.pread(fd, size, offset)

    A handle in use is never closed under its reader: the bound applies to idle handles, so
    it can be exceeded by the handles in use at once (one per reading thread). A source over
    10,000 files thus holds ``max_open`` descriptors (default :func:`max_open_handles`, from
    the process's limit), not 10,000. When the process has no descriptor left (EMFILE), every
    ``LazyHandles`` of the process closes its idle handles and the open is tried once more;
    failing again, it raises an OSError (EMFILE) that names the file and the limit.
    """

    def __init__(
        self, opener: Callable[[Any], Any], closer: Callable[[Any], None] | None = None, max_open: int | None = None
    ):
        self._opener, self._closer = opener, closer or _close_handle  # module-level: it must pickle
        self._max_open = max_open
        self.max_open = max_open if max_open is not None else max_open_handles()
        self._held: OrderedDict = OrderedDict()  # key -> _Held, least recently used first
        self._pid = os.getpid()
        self._lock = threading.Lock()
        _EVERY_HANDLES.add(self)

    def use(self, key: Any = None) -> _InUse:
        """The handle for ``key``, open for the block (opened now if it is not open)."""
        return _InUse(self, key)

    def _release(self, held: _Held) -> None:
        with self._lock:
            held.users -= 1
            over = len(self._held) > self.max_open
        if over:
            self._trim(self.max_open)

    def _acquire(self, key: Any) -> _Held:
        if self._pid != os.getpid():  # a forked copy: never use the parent's handles
            self._held, self._pid, self._lock = OrderedDict(), os.getpid(), threading.Lock()
        held = self._take(key)
        if held is None:
            handle = self._open(key)  # outside the lock: a slow open never holds up other readers
            with self._lock:
                held = self._held.get(key)
                if held is None:
                    held, handle = self._held.setdefault(key, _Held(handle)), None
                held.users += 1
            if handle is not None:  # another thread opened it meanwhile: keep one
                self._closer(handle)
        if len(self._held) > self.max_open:  # a thread that adds a handle checks after adding it
            self._trim(self.max_open)
        return held

    def _take(self, key: Any) -> _Held | None:
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.users += 1
                self._held.move_to_end(key)
            return held

    def _open(self, key: Any) -> Any:
        try:
            return self._opener(key)
        except OSError as exc:
            if exc.errno not in NO_FDS:
                raise
        for handles in list(_EVERY_HANDLES):  # out of descriptors: give back every idle one, try again
            handles._trim(0)
        try:
            return self._opener(key)
        except OSError as exc:
            if exc.errno not in NO_FDS:
                raise
            raise OSError(exc.errno, f"cannot open {_describe(key)}: {exc.strerror}: {fd_limit_note()}") from exc

    def _trim(self, keep: int) -> None:
        """Close idle handles, least recently used first, until at most ``keep`` remain open."""
        with self._lock:
            if len(self._held) <= keep:  # the common case, every batch: nothing to close
                return
            idle = [key for key, held in self._held.items() if held.users == 0]
            closing = [self._held.pop(key).handle for key in idle[: max(0, len(self._held) - keep)]]
        for handle in closing:
            self._closer(handle)

    def open_count(self) -> int:
        return len(self._held)

    def close(self) -> None:
        with self._lock:
            held, self._held = self._held, OrderedDict()
        for entry in held.values():
            self._closer(entry.handle)

    def __getstate__(self) -> dict:
        return {"_opener": self._opener, "_closer": self._closer, "_max_open": self._max_open}

    def __setstate__(self, state: dict) -> None:
        LazyHandles.__init__(self, state["_opener"], state["_closer"], state.get("_max_open"))


_EVERY_HANDLES: weakref.WeakSet[LazyHandles] = weakref.WeakSet()  # what an EMFILE may close


def _describe(key: Any) -> str:
    """A handle's key as a message names it: the file, where the key holds one."""
    for part in key if isinstance(key, tuple) else (key,):
        name = getattr(part, "filename", part)
        if isinstance(name, (str, os.PathLike)):
            return os.fspath(name)
    return repr(key)


def _close_handle(handle: Any) -> None:
    handle.close()


@dataclass(frozen=True)
class MappedFile:
    """How to reopen a read-only np.memmap in another process instead of copying its data."""

    filename: str
    offset: int
    dtype: np.dtype  # the dtype itself: a string would lose structured dtypes
    shape: tuple
    order: Literal["C", "F"]

    def open(self, file: Any = None) -> np.memmap:
        """The mapping, of ``file`` (an open file object of ``filename``) when given."""
        return np.memmap(
            self.filename if file is None else file,
            dtype=np.dtype(self.dtype),
            mode="r",
            offset=self.offset,
            shape=self.shape,
            order=self.order,
        )
