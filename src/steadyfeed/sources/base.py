"""The source protocol and the helpers the engine uses to talk to any source.

A source is any object with ``__len__`` and ``__getitem__(i) -> dict[str, array-like]``;
the sample id is ``i``. Optional extras the engine uses when present:

* ``read_many(ids) -> list[dict]``: one call for a whole batch, when that is cheaper;
* ``read_batch(ids) -> dict[str, array]``: the batch as stacked columns (first dimension
  ``len(ids)``), freshly allocated for the caller to keep (never a buffer the source
  reuses); with no transform the engine uses them as the batch, skipping all per-sample
  work. Sources that offer it get ``read_many`` from
  :func:`split_rows`;
* ``locate(i) -> str``: where sample ``i`` lives (a file path, a row), for error messages;
* ``close()``: release file handles (called when a worker or the loader shuts down);
* ``fingerprint() -> str``: changes whenever the data may have changed (paths, sizes,
  modification times), so caches and indexes built from the source know when to rebuild.

Sources never hold open handles in their pickled state (see :class:`LazyHandles`), so
they travel to spawned worker processes and reopen there.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


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
        raise TypeError(
            f"a source needs __len__ and __getitem__(i) -> dict, got {type(source).__name__}"
        )


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


def read_columns(source: Any, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray] | None:
    """The batch via ``source.read_batch`` when offered and well-formed, else None.

    None means "take the per-sample path", which pins any failure on its sample id.
    """
    fn = getattr(source, "read_batch", None)
    if fn is None or len(ids) == 0:
        return None
    try:
        columns = fn(ids)
    except Exception:
        return None
    if not isinstance(columns, Mapping):
        return None
    for column in columns.values():
        if not isinstance(column, np.ndarray) or column.dtype == object or len(column) != len(ids):
            return None
    return dict(columns)


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


class LazyHandles:
    """File handles opened on first use, once per process, shared by that process's threads.

    A source keeps one of these instead of open files, so it pickles without handles
    (a handle inherited across processes shares its file offset and locks) and every
    worker process reopens what it needs. ``opener(key)`` opens one handle; handles
    must be safe to share between threads (e.g. read with ``os.pread``, or h5py,
    which serializes its calls).
    """

    def __init__(self, opener: Callable[[Any], Any], closer: Callable[[Any], None] | None = None):
        self._opener, self._closer = opener, closer or _close_handle  # module-level: it must pickle
        self._handles: dict = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def get(self, key: Any = None) -> Any:
        if self._pid != os.getpid():  # a forked copy: never use the parent's handles
            self._handles, self._pid, self._lock = {}, os.getpid(), threading.Lock()
        handle = self._handles.get(key)
        if handle is None:
            with self._lock:
                handle = self._handles.get(key)
                if handle is None:
                    handle = self._handles[key] = self._opener(key)
        return handle

    def close(self) -> None:
        with self._lock:
            handles, self._handles = self._handles, {}
        for handle in handles.values():
            self._closer(handle)

    def __getstate__(self) -> dict:
        return {"_opener": self._opener, "_closer": self._closer}

    def __setstate__(self, state: dict) -> None:
        LazyHandles.__init__(self, state["_opener"], state["_closer"])


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
        return np.memmap(self.filename if file is None else file, dtype=np.dtype(self.dtype), mode="r",
                         offset=self.offset, shape=self.shape, order=self.order)
