"""Index files cached beside the data they index (or in a ``cache_dir``), never trusted stale.

A source that needs a pass over a file to find where its samples start (``CsvSource``,
``TFRecordSource``) saves what it found as ``<file>.sfidx.npy``: an int64 ``.npy`` array
whose first rows hold a *stamp* and whose remaining rows are the source's own payload.
The stamp is ``(MAGIC, size, mtime_ns, *words)``: the indexed file's size and modification
time when it was indexed, plus the words the payload also depends on (the source's format
version, parsing options). Callers rebuild the index whenever :func:`load` returns None.

Guarantees:

* :func:`load` returns a payload only from a well-formed file whose stamp equals the one
  asked for; a missing, unreadable, truncated, foreign or stale file gives None, never an
  exception;
* :func:`save` replaces the file atomically (``files.atomic_file``), so concurrent
  builders and readers never see half of one, and reserves its bytes first: a full disk
  is a ``DiskFull`` naming the file and the bytes (callers warn and go on without the
  cache, ``warn_unsaved``), never a torn index;
* nothing is ever unpickled (``allow_pickle=False``).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings

import numpy as np

from ..files import atomic_file

SUFFIX = ".sfidx.npy"
MAGIC = 0x5346_4944_58  # "SFIDX": the first stamp word, so another .npy never passes for an index
NPY_HEADER_BYTES = 128  # what np.save writes before an int64 array's data, at most (a bound to reserve)


def cache_path(path: str, cache_dir: str | os.PathLike | None = None, suffix: str = SUFFIX) -> str:
    """Where the index of ``path`` lives: beside it, or in ``cache_dir`` under a name unique
    to the file's absolute path (two ``data.csv`` in different folders never share one).
    ``suffix``: another file cached the same way (a compressed TFRecord's decompressed copy)."""
    if cache_dir is None:
        return path + suffix
    tag = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(os.fspath(cache_dir), f"{tag}-{os.path.basename(path)}{suffix}")


def file_stamp(st: os.stat_result, *words: int) -> tuple[int, ...]:
    """The stamp of a file as ``st`` describes it; ``words`` are whatever else the index depends on."""
    return (MAGIC, st.st_size, st.st_mtime_ns, *(int(w) for w in words))


def save(target: str, stamp: tuple[int, ...], payload: np.ndarray) -> None:
    """Write ``stamp`` and the int64 ``payload`` (1-D, or rows of a fixed width) to ``target``,
    atomically, creating its directory. Raises OSError when that is not possible."""
    payload = np.asarray(payload, dtype=np.int64)
    rows = np.concatenate([_header(stamp, payload.shape[1:]), payload])
    with atomic_file(target, fsync=False, size=rows.nbytes + NPY_HEADER_BYTES) as f:
        np.save(f, rows)


def load(target: str, stamp: tuple[int, ...], *, mmap: bool = False) -> np.ndarray | None:
    """The payload saved with ``stamp`` at ``target``, or None when there is none, it is
    damaged, or it was saved with another stamp. ``mmap=True`` maps it read-only instead of
    reading it; the caller still checks the payload's own shape and values."""
    try:
        a = np.load(target, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # missing or unreadable: the caller rebuilds
        return None
    if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim == 0 or 0 in a.shape[1:]:
        return None  # (an .npz archive loads as something else)
    a = a.view(np.ndarray)  # a plain view of a memmap: slicing one costs microseconds
    head = _header(stamp, a.shape[1:])
    if len(a) < len(head) or not np.array_equal(a[: len(head)], head):
        return None
    return a[len(head) :]


def warn_unsaved(what: str, target: str, exc: OSError, stacklevel: int = 2) -> None:
    """Warn that an index could not be saved; ``what`` says whose, e.g. "could not cache the index of x"."""
    warnings.warn(
        f"{what} at {target} ({exc}); it is rebuilt every time: pass cache_dir= a writable directory",
        stacklevel=stacklevel + 1,
    )


def _header(stamp: tuple[int, ...], row_shape: tuple[int, ...]) -> np.ndarray:
    """The stamp as leading rows shaped like the payload's, zero-padded to whole rows."""
    width = math.prod(row_shape)
    words = np.zeros(-(-len(stamp) // width) * width, dtype=np.int64)
    words[: len(stamp)] = stamp
    return words.reshape(-1, *row_shape)
