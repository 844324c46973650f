"""Caches of decoded samples: :class:`MemoryCache` (in memory, within a byte budget) and
:class:`DiskCache` (one file per sample, in a directory reused across runs).

A cache wraps the *source*, so it sits before the transform: the loader reads through
the cache and then applies the random transform with each sample's own rng. Decoding
happens once; augmentation stays random across epochs and bit-identical for any worker
count, exactly as without the cache::

    source = DiskCache(ImageFolder("images/", size=(128, 128)), "/scratch/steadyfeed-cache")
    loader = Loader(source, 64, shuffle=True, transform=augment, workers=4)

Both are sources themselves: ``len``, ``read_many``, ``locate``, ``close`` and
``fingerprint`` go to the wrapped source, and ``cache[i]`` equals ``source[i]`` with
every value as a numpy array and every key a string. What they guarantee:

* every array they return is fresh and writable: a transform that changes its input in
  place cannot reach the cached copy;
* they are picklable (``mode="process"``) and safe to call from many threads at once;
* they never hold Python objects: a sample whose value has dtype ``object`` is refused
  with a ``TypeError`` (its size could not be budgeted, nor stored without pickle).

What they do not: samples are cached in the form the source returns them, so a source
whose ``i``-th sample changes between reads (say, a random crop inside ``__getitem__``)
is frozen at its first read. Keep randomness in the transform.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import shutil
import threading
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from ..files import atomic_write
from ..units import exact_bytes
from .base import as_sample, fingerprint, read_many
from .wrapper import SourceWrapper

DISK_FORMAT = "steadyfeed.diskcache/1"
MAGIC = b"\x93STEADYFEED-CACHE\n"
MARKER = "steadyfeed-cache.json"  # names a directory as ours: prune() removes nothing else


def _nbytes(sample: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in sample.values())


class _Cache(SourceWrapper):
    """What both caches share: the hit/miss path, counters, pickling (delegation: ``SourceWrapper``).

    A subclass provides ``_get(i)`` (a fresh sample, or None on a miss) and
    ``_put(i, sample)``; attributes named in ``_PER_PROCESS`` are rebuilt by
    ``_init_state`` in every process instead of being pickled. ``close()`` closes the wrapped
    source only: workers close their source when they stop, and the next epoch or Loader
    should still find the cached samples.
    """

    _PER_PROCESS: tuple = ("_lock", "_hits", "_misses")

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._hits = self._misses = 0

    # -- the source protocol ------------------------------------------------------------
    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        i = self._index(i)
        sample = self._counted(self._get(i))
        return sample if sample is not None else self._keep(i, self.source[i])

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, np.ndarray]]:
        """Hits from the cache; misses in one ``source.read_many`` call when it offers one."""
        return self._samples(ids, copy=True)

    def read_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The batch as fresh stacked columns: hits are stacked straight from the cache (one copy,
        the stack), which lets the engine skip its per-sample path when there is no transform."""
        samples = self._samples(ids, copy=False)
        return {key: np.stack([sample[key] for sample in samples]) for key in samples[0]}

    def _samples(self, ids, copy: bool) -> list[dict[str, np.ndarray]]:
        ids = [self._index(i) for i in ids]
        samples = [self._counted(self._get(i, copy)) for i in ids]
        missing = [p for p, s in enumerate(samples) if s is None]
        if missing:
            miss_ids = [ids[p] for p in missing]
            raws = read_many(self.source, miss_ids)
            if raws is None:  # no read_many, or it failed: one by one pins a failure on its own id
                raws = [self.source[i] for i in miss_ids]
            for p, i, raw in zip(missing, miss_ids, raws):
                samples[p] = self._keep(i, raw)
        return samples

    def _get(self, i: int, copy: bool = True) -> dict[str, np.ndarray] | None:
        raise NotImplementedError  # provided by each cache

    def _put(self, i: int, sample: dict[str, np.ndarray]) -> None:
        raise NotImplementedError  # provided by each cache

    # -- the shared path ------------------------------------------------------------------
    def _index(self, i) -> int:
        i, n = int(i), len(self.source)
        if not 0 <= i < n:
            raise IndexError(f"sample id {i} out of range for {type(self).__name__} of length {n}")
        return i

    def _counted(self, sample):
        with self._lock:
            if sample is None:
                self._misses += 1
            else:
                self._hits += 1
        return sample

    def _keep(self, i: int, raw: Any) -> dict[str, np.ndarray]:
        """Store a freshly read sample and return it (the source's own arrays, not the stored ones)."""
        sample = as_sample(raw)
        self._put(i, sample)
        return sample

    def stats(self) -> dict:
        """Counters of this process (a worker process keeps its own; the consumer's stay 0 then)."""
        with self._lock:
            return {"hits": self._hits, "misses": self._misses}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._PER_PROCESS}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_state()


class MemoryCache(_Cache):
    """Keeps every sample read, in memory, within ``max_bytes``; the second read is a copy.

    The decoded size of the dataset is estimated from sample 0 (read once at
    construction) as ``nbytes(sample 0) * len(source)``; when that exceeds ``max_bytes``
    the cache is refused at once with a :class:`DataError` that says how much is needed.
    Each sample is measured again as it is stored: one that would take the cache past
    ``max_bytes`` (samples larger than sample 0) raises :class:`DataError` naming the
    budget, the bytes held and the estimate, so memory never grows past the budget.
    ``max_bytes`` counts array bytes, not the few hundred bytes of bookkeeping per sample.

    Per process: the cache pickles empty, so in ``mode="process"`` every worker fills its
    own copy. Memory use can then reach ``workers * max_bytes``, and a sample is a hit
    only on a worker that read it before (up to ``workers`` reads per sample). Prefer
    ``mode="thread"`` (one cache shared by all workers; decoders that release the GIL
    run in parallel anyway) or :class:`DiskCache` with process workers.
    """

    _PER_PROCESS = _Cache._PER_PROCESS + ("_stored", "_bytes")

    def __init__(self, source: Any, max_bytes: int) -> None:
        super().__init__(source)
        if int(max_bytes) < 0:
            raise ValueError(f"max_bytes must be a byte count >= 0, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self.sample_bytes = _nbytes(as_sample(source[0])) if len(source) else 0
        self.estimate = self.sample_bytes * len(source)
        if self.estimate > self.max_bytes:
            raise DataError(
                f"MemoryCache needs about {exact_bytes(self.estimate)} for {len(source)} samples (sample 0 holds "
                f"{exact_bytes(self.sample_bytes)} of arrays), more than max_bytes={exact_bytes(self.max_bytes)}. Raise "
                "max_bytes if memory allows (it is per process: in mode='process' each worker keeps its own "
                "cache), or use DiskCache(source, directory), which keeps decoded samples on disk."
            )

    def _init_state(self) -> None:
        super()._init_state()
        self._stored: dict[int, dict[str, np.ndarray]] = {}
        self._bytes = 0

    def _get(self, i: int, copy: bool = True):
        """A hit as fresh arrays, or (``copy=False``) as the read-only stored ones."""
        with self._lock:
            stored = self._stored.get(i)
        if stored is None or not copy:
            return stored
        return {k: a.copy() for k, a in stored.items()}

    def _put(self, i: int, sample: dict[str, np.ndarray]) -> None:
        frozen = {k: _read_only_copy(a) for k, a in sample.items()}  # the source may reuse or change its arrays
        nbytes = _nbytes(frozen)
        with self._lock:
            if i in self._stored:  # another thread stored it meanwhile: count its bytes once
                return
            if self._bytes + nbytes > self.max_bytes:
                raise DataError(
                    f"MemoryCache is full: sample {i} ({exact_bytes(nbytes)}) does not fit in max_bytes="
                    f"{exact_bytes(self.max_bytes)}, which holds {exact_bytes(self._bytes)} in {len(self._stored)} samples "
                    f"already. The estimate was {exact_bytes(self.estimate)} from sample 0 ({exact_bytes(self.sample_bytes)}), "
                    "so samples are larger than sample 0. Raise max_bytes, or use DiskCache(source, directory)."
                )
            self._stored[i] = frozen
            self._bytes += nbytes

    def clear(self) -> None:
        """Drop every cached sample (of this process)."""
        with self._lock:
            self._stored, self._bytes = {}, 0

    def stats(self) -> dict:
        with self._lock:
            held = {"items": len(self._stored), "bytes": self._bytes}
        return {**super().stats(), **held, "max_bytes": self.max_bytes, "estimate": self.estimate}

    def _repr_options(self) -> str:
        return f", max_bytes={self.max_bytes}"


def _read_only_copy(a: np.ndarray) -> np.ndarray:
    copy = np.array(a, copy=True)
    copy.flags.writeable = False  # a bug of ours that handed out the stored array would fail loudly
    return copy


class DiskCache(_Cache):
    """Keeps every sample read as one file under ``directory``, for this and later runs.

    Samples live in ``directory/<digest>/<i>.sample``, where the digest covers the source's
    ``fingerprint()``, ``key``, type and length: when the data changes, its fingerprint
    changes and a new, empty subdirectory is used (``prune()`` deletes the old ones). A
    source without ``fingerprint()`` needs ``key=``, a string you change whenever the
    data or its decoding changes.

    Guarantees:

    * a file is written to a temporary name and renamed into place, so concurrent
      writers (threads, worker processes, other runs) and readers never see half a file;
    * a file is read without unpickling and checked (CRC-32 of the whole file, exact
      sizes, the sample id it was written for, no object arrays); one that fails any
      check is a miss: a ``RuntimeWarning`` names it, the sample comes from the source
      and the file is rewritten. A cache directory from elsewhere can therefore neither
      run code nor serve damaged data (a deliberately forged file with a valid checksum
      can serve wrong data, like any forged data file);
    * a file that cannot be written (disk full, read-only) leaves the sample served
      uncached, with one ``RuntimeWarning`` per process and ``stats()["write_errors"]``; the
      bytes of a file are reserved before any is written, so a full disk leaves no partial
      file (nor its temporary one) and the warning names the file and the bytes it needed;
    * a ``directory`` that cannot be written at all (read-only, full, not creatable) warns
      once when the cache is made: the samples already cached there are served, the others
      come from the source, uncached (counted in ``write_errors``), and training goes on.

    A file holds a short JSON header then each array in ``.npy`` format (see ``_encode``).
    A temporary file of a writer killed mid-write (``.*.tmp``) stays until its
    subdirectory is removed. Counters are per process, like :class:`MemoryCache`'s.
    """

    _PER_PROCESS = _Cache._PER_PROCESS + ("_corrupt", "_write_errors")
    unwritable: str | None = None  # why the directory cannot take new files, when it cannot

    def __init__(self, source: Any, directory: str | os.PathLike[str], *, key: str | None = None) -> None:
        super().__init__(source)
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a string, got {type(key).__name__}")
        identity = _identity(source, key)
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
        self.root = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.root, digest)
        try:
            os.makedirs(self.path, exist_ok=True)
            if not os.path.exists(os.path.join(self.path, MARKER)):
                atomic_write(os.path.join(self.path, MARKER), json.dumps(identity, indent=1).encode(), fsync=False)
        except OSError as exc:  # read-only, full: serve what is there, read the rest from the source
            self.unwritable = str(exc)
            warnings.warn(
                f"DiskCache cannot write to {self.path} ({exc}); samples cached there already are "
                "served, the others come from the source uncached (stats()['write_errors'] counts "
                "them)",
                RuntimeWarning,
                stacklevel=2,
            )

    def _init_state(self) -> None:
        super()._init_state()
        self._corrupt = self._write_errors = 0

    def _file(self, i: int) -> str:
        return os.path.join(self.path, f"{i}.sample")

    def _get(self, i: int, copy: bool = True):  # a decoded file is always fresh
        path = self._file(i)
        try:
            with open(path, "rb") as f:
                return _decode(f.read(), i)
        except (FileNotFoundError, NotADirectoryError):  # no file there (yet): a plain miss
            return None
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, the source has the truth
            with self._lock:
                self._corrupt += 1
            warnings.warn(
                f"DiskCache: {path} is not a valid cache file for sample {i} ({type(exc).__name__}: "
                f"{exc}); reading the sample from the source and rewriting the file",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def _put(self, i: int, sample: dict[str, np.ndarray]) -> None:
        failed = None
        if self.unwritable is None:
            try:
                atomic_write(self._file(i), _encode(sample, i), fsync=False)
                return
            except OSError as exc:
                failed = exc
        with self._lock:
            self._write_errors += 1
            first = self._write_errors == 1 and failed is not None  # an unwritable directory was said already
        if first:  # once per process: a full disk would otherwise warn on every sample
            warnings.warn(
                f"DiskCache cannot write to {self.path} ({failed}); samples are served from the "
                "source uncached (stats()['write_errors'] counts them)",
                RuntimeWarning,
                stacklevel=4,
            )

    def prune(self) -> list[str]:
        """Delete the cache subdirectories of ``directory`` other than this one (older
        fingerprints or other keys) and return their paths. Only directories marked as a
        steadyfeed cache are touched. Use one ``directory`` per dataset, and prune when no
        other run reads from it."""
        removed = []
        for entry in os.scandir(self.root):
            ours = entry.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(entry.path, MARKER))
            if ours and entry.path != self.path:
                shutil.rmtree(entry.path)
                removed.append(entry.path)
        return sorted(removed)

    def stats(self) -> dict:
        with self._lock:
            errors = {"corrupt": self._corrupt, "write_errors": self._write_errors}
        return {**super().stats(), **errors, "directory": self.path}

    def _repr_options(self) -> str:
        return f", {self.path!r}"


def _identity(source: Any, key: str | None) -> dict:
    """What names a cache subdirectory: anything that changes the samples must change this."""
    fp = fingerprint(source)
    if fp is None and key is None:
        raise ValueError(
            f"DiskCache cannot tell when {type(source).__name__} changes: it has no fingerprint() method. "
            "Pass key='...', a string you change whenever the data or its decoding changes (e.g. a dataset version)."
        )
    kind = type(source)
    return {
        "format": DISK_FORMAT,
        "source": f"{kind.__module__}.{kind.__qualname__}",
        "fingerprint": fp,
        "key": key,
        "samples": len(source),
    }


def _encode(sample: dict[str, np.ndarray], i: int) -> bytes:
    """``MAGIC``, a 4-byte header length, a JSON header (sample id, member names and sizes),
    each array in .npy format one after another, then the CRC-32 of everything before it."""
    members = [_npy_bytes(arr) for arr in sample.values()]
    header = json.dumps(
        {"format": DISK_FORMAT, "sample": i, "members": [[key, len(m)] for key, m in zip(sample, members)]}
    ).encode()
    body = b"".join([MAGIC, len(header).to_bytes(4, "little"), header, *members])
    return body + zlib.crc32(body).to_bytes(4, "little")


def _npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, arr, allow_pickle=False)
    return out.getvalue()


def _decode(blob: bytes, i: int) -> dict[str, np.ndarray]:
    """The sample in ``blob``, or an exception saying what is wrong with it."""
    body = memoryview(blob)[:-4]
    if body[: len(MAGIC)] != MAGIC or zlib.crc32(body) != int.from_bytes(blob[-4:], "little"):
        raise ValueError("not a steadyfeed cache file, or its CRC-32 does not match")
    start = len(MAGIC) + 4
    end = start + int.from_bytes(body[len(MAGIC) : start], "little")
    header = json.loads(bytes(body[start:end]))
    if (header.get("format"), header.get("sample")) != (DISK_FORMAT, i):
        raise ValueError(f"written as sample {header.get('sample')!r} in format {header.get('format')!r}")
    sample = {}
    for key, size in header["members"]:
        sample[key] = _read_npy(body[end : end + size])
        end += size
    return sample


def _read_npy(data: memoryview) -> np.ndarray:
    """A fresh, writable array; object arrays are refused (loading them would unpickle)."""
    size = 10 + int.from_bytes(data[8:10], "little") if data[6] == 1 else 12 + int.from_bytes(data[8:12], "little")
    layout = _npy_layout(bytes(data[:size]))
    if layout is None:  # .npy format 3.0 (non-Latin-1 field names): numpy's own, slower reader
        return np.load(io.BytesIO(data), allow_pickle=False)
    shape, fortran, dtype = layout
    if dtype.hasobject:
        raise ValueError("it holds an object array, which is never loaded (allow_pickle=False)")
    count = math.prod(shape)
    if len(data) - size != count * dtype.itemsize:
        raise ValueError(f"an array of {shape} {dtype} cannot fill {len(data) - size} bytes")
    flat = np.frombuffer(data, dtype, count, offset=size)
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


@functools.lru_cache(maxsize=256)
def _npy_layout(prefix: bytes):
    """(shape, fortran_order, dtype) of a .npy header, parsed by numpy (literals only, no code).
    Parsing is most of a hit's cost and every sample of a key shares its header, so once."""
    buf = io.BytesIO(prefix)
    version = np.lib.format.read_magic(buf)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    return None if reader is None else reader(buf)
