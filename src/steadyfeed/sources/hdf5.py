"""Hdf5Source: named datasets of one HDF5 file, sharing their first dimension.

``Hdf5Source("d.h5", x="/images", y="/labels")[i] == {"x": images[i], "y": labels[i]}``.

Guarantees:

* **Checked at construction.** A missing file raises ``FileNotFoundError``; a file that is not
  HDF5, is truncated or cannot be opened, a missing dataset path (listing the datasets that do
  exist), a group or scalar where a dataset of rows was expected, and datasets of different
  lengths raise :class:`~steadyfeed.DataError` naming the file and what was expected.
* **No handle travels.** The file is opened lazily, once per process, and shared by that
  process's threads (h5py serializes every call with its global lock, so one ``File`` per
  process is safe). A pickled source carries only the path and the dataset names, so spawned
  workers reopen the file themselves. Between construction and the first read no file is open.
* **Batched reads by contiguous runs.** ``read_many(ids)`` sorts and deduplicates the ids, reads
  each run of consecutive ids with one read straight into the output (a hyperslab read, or one
  ``preadv`` for uncompressed rows; ids a few rows apart share one read of their span), each
  row into its place in the requested order (repeats copied after), so a shuffled batch makes
  no reordered copy of itself. It returns exactly what per-sample reads return.
* **Per-sample failures name their place.** A row that cannot be read raises ``DataError`` naming
  the file, the dataset and the row; an id out of range raises ``IndexError``.
* **SWMR.** ``swmr=True`` reads a file that a writer still appends to in SWMR mode. The source
  serves the rows every dataset held at construction (the shortest length, since a writer extends
  its datasets one after another); rows appended later need a new source. HDF5 shares one open
  file per process, and a new source sees the lengths of that shared file: close the sources that
  hold it open in this process first (refreshing a dataset under a second open handle makes HDF5
  fail reads that span several chunks, so this source never refreshes).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import DataError
from .base import Allocator, LazyHandles, file_fingerprint, numpy_allocator, split_rows
from .raw_rows import GAP_BYTES, FileOrder, RawRows, read_rows, spans  # GAP_BYTES also rules HDF5 calls here

try:
    import h5py
    from h5py import h5d, h5p, h5s
except ImportError:  # the core needs numpy only; say how to get the optional dependency
    h5py = None

_LISTED = 20  # how many existing datasets a "missing dataset" message lists


class Hdf5Source:
    """Serves ``{name: dataset[i]}`` for the HDF5 datasets given as ``name="/path/in/file"``.

    ``swmr`` is the only reserved name; ``path`` is positional, so a key may be called ``path``.

    >>> src = Hdf5Source("d.h5", x="/images", y="/labels")   # doctest: +SKIP
    >>> sorted(src[0])                                        # doctest: +SKIP
    ['x', 'y']
    """

    def __init__(self, path: str | os.PathLike[str], /, *, swmr: bool = False, **keys: str) -> None:
        if h5py is None:
            raise ImportError("Hdf5Source needs h5py: pip install 'steadyfeed[hdf5]'")
        if not keys:
            raise ValueError('Hdf5Source needs at least one dataset, e.g. Hdf5Source("d.h5", x="/images")')
        self.path = os.path.abspath(os.fspath(path))
        self.keys = {name: str(dataset) for name, dataset in keys.items()}
        self.swmr = bool(swmr)
        self._handles = LazyHandles(functools.partial(_open, self.path, tuple(self.keys.items()), self.swmr), _close)
        try:
            with self._handles.use() as handle:
                self._rows = {name: (ds.shape[1:], ds.dtype) for name, ds in handle.datasets.items()}
                self._len = self._checked_length({name: ds.shape[0] for name, ds in handle.datasets.items()})
        finally:
            self._handles.close()  # validation only: readers open their own handle on first use

    def _checked_length(self, lengths: dict[str, int]) -> int:
        if len(set(lengths.values())) > 1 and not self.swmr:
            listed = ", ".join(f"{self.keys[name]} has {n} rows" for name, n in lengths.items())
            raise DataError(f"{self.path}: datasets must have the same length (first dimension), but {listed}")
        return min(lengths.values())

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict:
        return self.read_many([i])[0]

    def read_batch(self, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None) -> dict[str, np.ndarray]:
        """The rows for ``ids`` as stacked columns, in the order asked, repeats allowed: each row
        read in file order straight into its place (``allocate``: where the columns go, the source
        protocol's, ``sources/base.py``), so a shuffled batch needs no reordered copy of itself;
        see :meth:`_read_rows`."""
        ids = self._checked_ids(ids)
        order = FileOrder.of(ids)
        specs = {name: ((len(ids), *shape), dtype) for name, (shape, dtype) in self._rows.items()}
        columns = (allocate or numpy_allocator)(specs)
        if not len(ids):
            return columns
        with self._handles.use() as handle:
            for name in self.keys:
                self._read_rows(name, handle, order, columns[name])
        order.fill_repeats(columns)
        return columns

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        return split_rows(self.read_batch(ids))

    def _checked_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self._len)]
        if bad.size:
            raise IndexError(f"sample id {int(bad[0])} out of range for {self!r} of length {self._len}")
        return ids

    def _read_rows(self, name: str, handle: _Open, order: FileOrder, dest: np.ndarray) -> None:
        """Rows ``order.unique`` of one dataset into their places in ``dest``: by file offset when
        it is stored raw, else through HDF5."""
        raw = handle.raw.get(name)
        if raw is None:
            self._read_hdf5_rows(name, handle.datasets[name], order, dest)
            return
        assert handle.fd is not None  # opened for every dataset stored raw
        rows = dest.view(np.uint8).reshape(len(dest), raw.row_bytes)
        # by the rule of _read_hdf5_rows (GAP_BYTES), with one preadv per span (raw_rows.read_rows)
        short = read_rows(handle.fd, raw, order.unique, rows, GAP_BYTES, order.places)
        if short is not None:
            raise DataError(
                f"{self.path}: rows {short[0]}..{short[1]} of dataset {self.keys[name]} "
                f"end past the end of the file (truncated since it was opened?)"
            )

    def _read_hdf5_rows(self, name: str, ds, order: FileOrder, dest: np.ndarray) -> None:
        """Rows ``order.unique`` of one dataset into their places in ``dest``, with one HDF5 read
        per span of nearby ids.

        A run of consecutive ids going to consecutive rows is read straight into them. Other
        spans are read whole, then copied to their rows: ids separated by fewer than
        ``GAP_BYTES`` of unrequested rows share one read of their whole span (one HDF5 call
        costs about as much as copying that much data), which turns e.g. 32 scattered label
        reads into one.
        """
        ids, places = order.unique, order.places
        shape, dtype = self._rows[name]
        max_gap = GAP_BYTES // max(math.prod(shape) * dtype.itemsize, 1)
        for a, b in spans(ids, max_gap):
            start, stop = int(ids[a]), int(ids[b - 1]) + 1
            if stop - start == b - a and places is None:
                self._read_span(name, ds, start, dest[a:b])
            else:
                span = np.empty((stop - start, *shape), dtype)
                self._read_span(name, ds, start, span)
                dest[slice(a, b) if places is None else places[a:b]] = span[ids[a:b] - start]

    def _read_span(self, name: str, ds, start: int, dest: np.ndarray) -> None:
        """Rows ``start:start + len(dest)`` into the contiguous array ``dest``, in one HDF5 read."""
        try:
            space = ds.id.get_space()  # a fresh dataspace per read: threads never share a selection
            space.select_hyperslab((start,) + (0,) * (dest.ndim - 1), dest.shape)
            ds.id.read(h5s.create_simple(dest.shape), space, dest)
        except Exception as exc:  # noqa: BLE001 - any HDF5 failure becomes a message naming the rows
            shape, dtype = self._rows[name]
            raise DataError(
                f"{self.path}: cannot read rows {start}..{start + len(dest) - 1} of dataset {self.keys[name]} "
                f"(expected {dtype} rows of shape {shape}): {exc}"
            ) from exc

    def locate(self, i: int) -> str:
        return f"{self.path} row {int(i)} of {', '.join(self.keys.values())}"

    def fingerprint(self) -> str:
        """Changes with the file's path, size or modification time, or the datasets read."""
        keys = "\0".join(f"{name}={dataset}" for name, dataset in sorted(self.keys.items()))
        return hashlib.sha256(f"{file_fingerprint([self.path])}\0{keys}".encode()).hexdigest()

    def close(self) -> None:
        """Close this process's file handle; the next read reopens it."""
        self._handles.close()

    def __repr__(self) -> str:
        keys = ", ".join(f"{name}={dataset!r}" for name, dataset in self.keys.items())
        return f"Hdf5Source({self.path!r}, {keys}{', swmr=True' if self.swmr else ''})"


class _Open(NamedTuple):
    """One process's open file and its datasets (what ``LazyHandles`` keeps), plus, for datasets
    stored raw, where their rows lie in the file and a plain descriptor to read them with."""

    file: h5py.File
    datasets: dict
    raw: dict  # name -> RawRows for uncompressed datasets whose rows can be read by offset
    fd: int | None


def _raw_rows(ds) -> RawRows | None:
    """The raw layout of ``ds`` when every row can be read straight from the file, else None.

    That needs no filters (compression), a fixed-size plain dtype, and either a contiguous
    allocated dataset or chunks spanning whole rows, all allocated. Reading by offset with
    ``os.preadv`` skips h5py's process-wide lock and releases the GIL, so thread workers read in
    parallel (h5py serializes every call, which made two threads slower than one).
    """
    dcpl = ds.id.get_create_plist()
    if dcpl.get_nfilters() or ds.dtype.hasobject or h5py.check_vlen_dtype(ds.dtype) is not None:
        return None
    row_bytes = math.prod(ds.shape[1:]) * ds.dtype.itemsize
    n = ds.shape[0]
    if ds.chunks is None:
        offset = ds.id.get_offset()
        if offset is None or n == 0:
            return None
        return RawRows.contiguous(offset, n, row_bytes)
    if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
        return None
    per_chunk = ds.chunks[0]
    count = ds.id.get_num_chunks()
    if count != -(-n // per_chunk):
        return None  # some chunks never written: HDF5 fills them with the fill value, so let it
    offsets = np.empty(count, np.int64)
    for k in range(count):
        info = ds.id.get_chunk_info(k)
        offsets[info.chunk_offset[0] // per_chunk] = info.byte_offset
    follows = offsets[1:] == offsets[:-1] + per_chunk * row_bytes  # chunk k+1 starts where chunk k ends
    return RawRows(offsets, per_chunk, row_bytes, np.concatenate(([0], np.cumsum(~follows))))


def _open(path: str, keys: tuple[tuple[str, str], ...], swmr: bool, _key=None) -> _Open:
    """The file and its datasets, opened for reading; raises naming what is wrong.

    ``_key`` is the ``LazyHandles`` key, always None: a source has one file.
    """
    f = _open_file(path, swmr, expected=", ".join(dataset for _, dataset in keys))
    try:
        datasets = {name: _open_dataset(f, path, dataset) for name, dataset in keys}
        # a file still being written (SWMR) may move its chunks: read it through HDF5 only
        raw = {} if swmr else {name: r for name, ds in datasets.items() if (r := _raw_rows(ds)) is not None}
        return _Open(f, datasets, raw, os.open(path, os.O_RDONLY) if raw else None)
    except BaseException:
        f.close()
        raise


def _close(handle: _Open) -> None:
    handle.file.close()  # h5py closes every object of the file with it
    if handle.fd is not None:
        os.close(handle.fd)


def _open_file(path: str, swmr: bool, expected: str):
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"no such HDF5 file (expected one holding {expected})", path)
    try:
        return h5py.File(path, "r", swmr=swmr)
    except OSError as exc:
        what = (
            "is an HDF5 file that cannot be opened (truncated, corrupt, or being written: pass "
            "swmr=True for a file written in SWMR mode)"
            if h5py.is_hdf5(path)
            else "is not an HDF5 file (no HDF5 signature)"
        )
        raise DataError(f"{path} {what}; expected an HDF5 file holding {expected}: {exc}") from exc


def _open_dataset(f, path: str, dataset: str):
    kind = f.get(dataset, getclass=True)
    if kind is not h5py.Dataset:
        found = f"no dataset {dataset}" if kind is None else f"{dataset} is a {kind.__name__.lower()}, not a dataset"
        raise DataError(f"{path}: {found}; datasets in the file: {_listing(f)}")
    ds = h5py.Dataset(h5d.open(f.id, dataset.encode(), _access(f, dataset)))
    if ds.ndim == 0:
        raise DataError(f"{path}: {dataset} is a scalar; expected a dataset with one row per sample")
    return ds


def _access(f, dataset: str) -> h5p.PropDAID:
    """Dataset access with a chunk cache sized for reading rows.

    Uncompressed chunks get no cache, so HDF5 reads just the requested rows from disk (a cache
    would pull in a whole chunk to serve one row: 4-5x slower for shuffled reads, measured). Compressed
    chunks are decompressed whole, so a few stay cached for the neighbouring rows of the next batch.
    """
    # Inspected through a handle that is gone before the caller reopens the dataset: HDF5 shares
    # one chunk cache among all open handles of a dataset, sized by the first one opened.
    ds = f[dataset]
    dapl = h5p.create(h5p.DATASET_ACCESS)
    _, nslots, nbytes, w0 = f.id.get_access_plist().get_cache()  # the file's defaults
    if ds.chunks is not None and ds.id.get_create_plist().get_nfilters() == 0:
        nbytes = 0
    elif ds.chunks is not None:
        nbytes = max(nbytes, 4 * int(np.prod(ds.chunks)) * ds.dtype.itemsize)
    dapl.set_chunk_cache(nslots, nbytes, w0)
    return dapl


def _listing(f) -> str:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
    shown = ", ".join(names[:_LISTED]) or "none"
    return shown + (f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else "")
