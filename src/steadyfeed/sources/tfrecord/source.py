"""TFRecordSource: random access to the ``tf.train.Example`` records of TFRecord files."""

from __future__ import annotations

import bisect
import glob
import hashlib
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import DataError
from ..base import LazyHandles, file_fingerprint
from .example import (
    FeatureSpec,
    RecordLayout,
    decode_example,
    example_classes,
    infer_features,
    parse_example,
    parse_features,
)
from .framing import (
    INDEX_SUFFIX,
    RAW_SUFFIX,
    FileIndex,
    compression_name,
    open_index,
    read_record,
    record_name,
    require_crc32c,
)
from .manifest import read_manifest

INFER_RECORDS = 100  # records read to infer features= when it is not given


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
        files = sorted(p for p in glob.glob(pattern) if not p.endswith((INDEX_SUFFIX, RAW_SUFFIX)))
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

    * ``features``: key -> spec (see :mod:`.example`); None infers them from the first
      ``INFER_RECORDS`` records (``infer_features``: kind, dtype, fixed or variable length;
      ``self.specs`` shows what was inferred) unless a pack directory's manifest has them;
    * ``defaults``: key -> the value a record without that feature gets (else it is an error
      naming the record);
    * ``compression``: None detects it per file (``"GZIP"``, ``"ZLIB"`` or none, as
      ``TFRecordOptions`` writes them), or give it; a compressed file is read through a
      decompressed copy made once (see :mod:`.framing`);
    * ``cache_dir``: where the indexes (and decompressed copies) go when not beside the files.

    Guarantees: both CRCs of every record are checked on every read; a bad record raises
    :class:`DataError` naming its file, record number and byte offset, and never affects
    other records; a file whose framing breaks (cut inside a record, a corrupt length, a
    truncated gzip stream) reads every record before the break, and the break is one more
    sample, after them, whose read raises DataError naming the file and byte offset (so the
    loader raises, or quarantines it under ``on_error="skip"``: never silent); reads use
    ``os.pread`` on per-process handles, so threads share the source safely and it pickles
    without handles (workers reopen lazily).

    ``read_batch`` (the loader's no-transform fast path) reads a batch straight into one array
    per feature when every feature is a fixed-shape number array and no default is given; a
    pack's records are then copied at known places, without parsing (see ``RecordLayout``), the
    very values ``self[i]`` returns. Otherwise ``read_batch`` is None and samples are read one
    by one.
    """

    def __init__(
        self,
        paths: Any,
        features: Mapping[str, Any] | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        compression: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        require_support()
        files, packed_specs, counts = _resolve(paths)
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"TFRecord file not found: {path}")
        compression = compression_name(compression)
        self.paths = files
        self._files = [_opened(path, compression, cache_dir) for path in files]
        if counts is not None:
            _check_counts(self._files, counts)
        self._ends = np.cumsum([len(f.rows) + f.damaged for f in self._files], dtype=np.int64).tolist()
        self._starts = np.concatenate([[0], self._ends[:-1]]).astype(np.int64)  # each file's first sample id
        self._handles = LazyHandles(_open_readonly, os.close)
        self.inferred_notes: list[str] = []  # what inference left out, and why
        if features is not None:
            self.specs = parse_features(features)
        elif packed_specs is not None:
            self.specs = packed_specs
        else:
            self.specs, self.inferred_notes = self._infer()
        unknown = sorted(set(defaults or {}) - set(self.specs))
        if unknown:
            raise ValueError(f"defaults names {unknown}, which are not features; features are {sorted(self.specs)}")
        self.defaults = {key: self.specs[key].default(value, key) for key, value in (defaults or {}).items()}
        self._layout: RecordLayout | None = None  # learnt from the first record a batch reads (see read_batch)
        self._layout_tried = False
        if self.defaults or not all(spec.stacks for spec in self.specs.values()):
            # no stacked batch (a variable dimension, bytes / str, a default to put in): the engine
            # reads samples (read_many); setattr: an instance attribute hides the method
            setattr(self, "read_batch", None)  # noqa: B010 - mypy refuses assigning to a method

    def _infer(self) -> tuple[dict, list[str]]:
        """Specs from the first good records (up to INFER_RECORDS, across files)."""
        records: list[bytes] = []
        for f, index in enumerate(self._files):
            for r in range(min(len(index.rows), INFER_RECORDS - len(records))):
                records.append(self._data(f, r))
        if not records:
            raise ValueError(
                f"TFRecordSource cannot infer features= from {len(self.paths)} file(s) without a "
                f"readable record: pass features= (key -> (dtype, shape), 'bytes' or 'str')"
            )
        specs, notes = infer_features(records)
        if not specs:
            raise ValueError(
                f"TFRecordSource found no feature it can read in the first {len(records)} record(s) "
                f"({'; '.join(notes)}): pass features="
            )
        return specs, notes

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _record(self, i: int) -> tuple[int, int]:
        """(file number, record number in that file) of sample ``i``."""
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample id {i} out of range for TFRecordSource of length {len(self)}")
        f = bisect.bisect_right(self._ends, i)
        return f, i - (self._ends[f - 1] if f else 0)

    def _records(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file numbers, record numbers in those files) of the int64 sample ids ``ids``, as ``_record`` for many."""
        bad = ids[(ids < 0) | (ids >= len(self))]
        if bad.size:
            raise IndexError(f"sample id {bad[0]} out of range for TFRecordSource of length {len(self)}")
        files = np.searchsorted(self._ends, ids, side="right")
        return files, ids - self._starts[files]

    def _data(self, f: int, r: int) -> bytes:
        """The data of record ``r`` of file ``f``, CRCs checked; the damage's error past the last good record."""
        index = self._files[f]
        with self._handles.use(index.data_path) as fd:
            return _read(fd, index, r)

    def _decode(self, data: bytes, f: int, r: int, specs: Mapping[str, FeatureSpec] | None = None) -> dict:
        try:
            return decode_example(data, self.specs if specs is None else specs, self.defaults)
        except DataError as exc:
            index = self._files[f]
            raise DataError(f"{record_name(r, index.rows.item(r, 0), index.name)}: {exc}") from None

    def __getitem__(self, i: int) -> dict:
        f, r = self._record(i)
        return self._decode(self._data(f, r), f, r)

    def read_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The samples of ``ids`` as one fresh array per feature (first dimension ``len(ids)``), the
        records read in file and offset order (CRCs checked) and each one's values put straight
        into its row: copied at their places when the record has the layout of the first one read
        (:class:`RecordLayout`, exact), else decoded as ``self[i]`` decodes them. Offered only
        when every feature ``stacks`` and no default is given (else ``read_batch`` is None).
        A bad record raises as ``self[i]`` would (the engine then reads one by one, which names
        the sample)."""
        ids = [int(i) for i in ids]
        where = [self._record(i) for i in ids]
        n = len(ids)
        out = {key: np.empty((n, *spec.shape), spec.np_dtype.newbyteorder("=")) for key, spec in self.specs.items()}
        raw = {
            key: column.reshape(-1).view(np.uint8).reshape(n, -1 if column.size else 0) for key, column in out.items()
        }
        for f, run in itertools.groupby(sorted(range(n), key=ids.__getitem__), key=lambda k: where[k][0]):
            index = self._files[f]
            with self._handles.use(index.data_path) as fd:
                for k in run:
                    r = where[k][1]
                    data = _read(fd, index, r)
                    layout = self._layout
                    if layout is not None and layout.matches(data):
                        for key, (start, end) in layout.payloads.items():
                            raw[key][k] = np.frombuffer(data, np.uint8, end - start, start)
                        continue
                    for key, value in self._decode(data, f, r).items():
                        out[key][k] = value
                    if not self._layout_tried:  # once: a record that decoded, the first one read
                        self._layout_tried = True
                        self._layout = RecordLayout.learn(data, self.specs)
        return out

    def read_bytes(self, ids: Sequence[int] | np.ndarray, key: str) -> list[bytes]:
        """Feature ``key`` (a ``"bytes"`` spec) of the records of ``ids``, in that order: the
        records read in file and offset order, one handle per file (CRCs checked), and only that
        feature decoded. What a batch of encoded images reads (``PackedImages``); a bad record
        raises DataError naming it, as ``self[i]`` would."""
        spec = self.specs.get(key)
        if spec is None or spec.dtype != "bytes":
            raise ValueError(f"feature {key!r} is not a bytes feature of {self!r}")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        files, records = self._records(ids)
        values: list = [None] * len(ids)
        # sorted by id is sorted by file, then by offset
        for f, run in itertools.groupby(np.argsort(ids, kind="stable").tolist(), files.item):
            index = self._files[f]
            with self._handles.use(index.data_path) as fd:
                for k in run:
                    r = records.item(k)
                    values[k] = self._bytes_value(_read(fd, index, r), f, r, key)
        return values

    def _bytes_value(self, data: bytes, f: int, r: int, key: str) -> bytes:
        """The one value of bytes feature ``key`` in record ``data``, as ``_decode`` gives it:
        taken straight from the parsed record when it holds exactly one (the case of every
        record of a pack), else ``_decode``'s default or its error."""
        try:
            feature_map = parse_example(data).features.feature
        except DataError:
            feature_map = {}
        if key in feature_map:
            values = feature_map[key].bytes_list.value  # empty for a feature of another kind
            if len(values) == 1:
                return values[0]
        return self._decode(data, f, r, {key: self.specs[key]})[key]

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        """The samples of ``ids`` (in that order), read in file and offset order."""
        ids = [int(i) for i in ids]
        samples: list = [None] * len(ids)
        for k in sorted(range(len(ids)), key=ids.__getitem__):
            samples[k] = self[ids[k]]
        return samples

    def locate(self, i: int) -> str:
        f, r = self._record(i)
        index = self._files[f]
        offset = index.rows.item(r, 0) if r < len(index.rows) else index.damage_offset()
        stream = "" if not index.compression else " of its decompressed stream"
        return f"{self.paths[f]} record {r} at byte {offset}{stream}"

    @property
    def compressions(self) -> list[str]:
        """Each file's compression ("" none, "GZIP", "ZLIB"), as found."""
        return [index.compression for index in self._files]

    def fingerprint(self) -> str:
        specs = json.dumps({k: s.to_json() for k, s in self.specs.items()}, sort_keys=True)
        defaults = repr(
            sorted(
                (k, np.asarray(v).tobytes() if not isinstance(v, (bytes, str)) else v) for k, v in self.defaults.items()
            )
        )
        return hashlib.sha256(f"{file_fingerprint(self.paths)}\0{specs}\0{defaults}".encode()).hexdigest()

    def close(self) -> None:
        self._handles.close()

    def __repr__(self) -> str:
        features = ", ".join(f"{k}={s.describe()}" for k, s in self.specs.items())
        return f"TFRecordSource({len(self)} records in {len(self.paths)} file(s); {features})"


def _read(fd: int, index: FileIndex, r: int) -> bytes:
    """The data of record ``r`` of the file ``index`` describes (open as ``fd``), CRCs checked; the
    damage's error for the record past the last good one."""
    if r == len(index.rows):
        raise index.damage_error(fd)
    return read_record(fd, index.name, r, index.rows.item(r, 0), index.rows.item(r, 1))


def _opened(path: str, compression: str | None, cache_dir) -> FileIndex:
    """The file's index; DataError when not even its first record can be read (no TFRecord file)."""
    index = open_index(path, compression, cache_dir)
    if index.damaged and len(index.rows) == 0:
        raise index.damage_error()
    return index


def _check_counts(files: list[FileIndex], counts: list[int]) -> None:
    """A packed shard must hold the records its manifest lists: a damaged one would shift every id after it."""
    for index, expected in zip(files, counts):
        if index.damaged:
            raise DataError(f"{index.path} is damaged (the manifest says {expected} records): {index.damage_error()}")
        if len(index.rows) != expected:
            raise DataError(f"{index.path} has {len(index.rows)} records but the manifest says {expected}")
