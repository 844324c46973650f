"""TFRecordSource: random access to the ``tf.train.Example`` records of TFRecord files."""
from __future__ import annotations

import bisect
import glob
import hashlib
import json
import os
from typing import Any, Mapping

import numpy as np

from ...errors import DataError
from ..base import LazyHandles, file_fingerprint
from .example import decode_example, example_classes, parse_features
from .framing import INDEX_SUFFIX, load_index, read_record, record_name, require_crc32c
from .manifest import read_manifest


def require_support() -> None:
    """ImportError now, naming what to install, rather than on the first record."""
    require_crc32c()
    example_classes()


def _open_readonly(path: str) -> int:
    return os.open(path, os.O_RDONLY)


def _resolve(paths: Any) -> tuple[list[str], dict | None, list[int] | None]:
    """Files to read (sorted), plus (specs, record counts) when ``paths`` is a packed directory."""
    if isinstance(paths, (str, os.PathLike)):
        pattern = os.path.expanduser(os.fspath(paths))
        if os.path.isdir(pattern):
            return read_manifest(pattern)
        files = sorted(p for p in glob.glob(pattern) if not p.endswith(INDEX_SUFFIX))
        if not files:
            if not glob.has_magic(pattern):
                raise FileNotFoundError(f"TFRecord file not found: {pattern}")
            raise DataError(f"no files match {pattern!r}: expected TFRecord files")
        return files, None, None
    files = sorted(os.fspath(p) for p in paths)
    if not files:
        raise DataError("TFRecordSource got an empty list of files: expected at least one TFRecord file")
    return files, None, None


class TFRecordSource:
    """Random access to the ``tf.train.Example`` records of TFRecord files (see the package docstring).

    ``paths``: a glob, a file, a list of files (read in sorted order), or a ``pack`` output
    directory. Sample ``i`` is record ``i`` counting across the files in order.

    Guarantees: both CRCs of every record are checked on every read; a bad record raises
    :class:`DataError` naming its file, record number and byte offset, and never affects
    other records; reads use ``os.pread`` on per-process handles, so threads share the
    source safely and it pickles without handles (workers reopen lazily).
    """

    def __init__(self, paths: Any, features: Mapping[str, Any] | None = None, *,
                 cache_dir: str | os.PathLike | None = None):
        require_support()
        files, packed_specs, counts = _resolve(paths)
        if features is None and packed_specs is None:
            raise ValueError("TFRecordSource needs features= (key -> (dtype, shape), 'bytes' or 'str') unless "
                             "it reads a pack output directory, whose manifest has them")
        self.specs = parse_features(features) if features is not None else packed_specs
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"TFRecord file not found: {path}")
        self.paths = files
        self._rows = [load_index(path, cache_dir) for path in files]
        if counts is not None:
            _check_counts(files, self._rows, counts)
        self._ends = np.cumsum([len(rows) for rows in self._rows], dtype=np.int64).tolist()
        self._handles = LazyHandles(_open_readonly, os.close)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _record(self, i: int) -> tuple[int, int]:
        """(file number, record number in that file) of sample ``i``."""
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample id {i} out of range for TFRecordSource of length {len(self)}")
        f = bisect.bisect_right(self._ends, i)
        return f, i - (self._ends[f - 1] if f else 0)

    def __getitem__(self, i: int) -> dict:
        f, r = self._record(i)
        path, rows = self.paths[f], self._rows[f]
        offset, length = rows.item(r, 0), rows.item(r, 1)
        data = read_record(self._handles.get(path), path, r, offset, length)
        try:
            return decode_example(data, self.specs)
        except DataError as exc:
            raise DataError(f"{record_name(r, offset, path)}: {exc}") from None

    def read_many(self, ids) -> list[dict]:
        """The samples of ``ids`` (in that order), read in file and offset order."""
        ids = [int(i) for i in ids]
        samples: list = [None] * len(ids)
        for k in sorted(range(len(ids)), key=ids.__getitem__):
            samples[k] = self[ids[k]]
        return samples

    def locate(self, i: int) -> str:
        f, r = self._record(i)
        return f"{self.paths[f]} record {r} at byte {self._rows[f].item(r, 0)}"

    def fingerprint(self) -> str:
        specs = json.dumps({k: s.to_json() for k, s in self.specs.items()}, sort_keys=True)
        return hashlib.sha256(f"{file_fingerprint(self.paths)}\0{specs}".encode()).hexdigest()

    def close(self) -> None:
        self._handles.close()

    def __repr__(self) -> str:
        features = ", ".join(f"{k}={s.describe()}" for k, s in self.specs.items())
        return f"TFRecordSource({len(self)} records in {len(self.paths)} file(s); {features})"


def _check_counts(files: list[str], rows: list[np.ndarray], counts: list[int]) -> None:
    for path, found, expected in zip(files, rows, counts):
        if len(found) != expected:
            raise DataError(f"{path} has {len(found)} records but the manifest says {expected}")

