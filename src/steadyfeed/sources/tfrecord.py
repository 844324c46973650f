"""TFRecord files of ``tf.train.Example`` as a random-access source, and the pieces
``steadyfeed.pack`` writes them with. TensorFlow is never needed.

**Framing** (TensorFlow's, unchanged, so ``tf.data.TFRecordDataset`` reads our files and we
read its files): each record is ``uint64 length | uint32 masked_crc32c(length bytes) | data |
uint32 masked_crc32c(data)``, little-endian, where ``masked(c) = ((c >> 15) | (c << 17)) +
0xa282ead8 mod 2**32``. Both CRCs are verified on every read.

**Offset index**: random access needs where each record starts. One pass over a file reads
only the 12-byte headers (and seeks past the data) and caches ``int64[n + 2, 2]`` as
``<file>.sfidx.npy`` beside the file, or in ``cache_dir=``: row 0 is ``(INDEX_TAG,
INDEX_VERSION)``, row 1 is the file's ``(size, mtime_ns)`` when indexed, then one row
``(byte offset, data length)`` per record. An index whose file size or mtime changed, or
whose rows do not tile the file exactly, is rebuilt. A declared length is checked against
the bytes left in the file before anything is read, so a hostile length allocates nothing.

**Features**: ``features`` maps each output key to a spec: ``(dtype, shape)`` such as
``("float32", (64, 64, 3))`` or ``("int64", ())``; a dtype string alone (a scalar); or
``"bytes"`` / ``"str"`` for one variable-length value returned as Python ``bytes`` / ``str``.
An array feature is accepted in either of two encodings:

* TensorFlow's native lists: a ``float_list`` (dtype float32) or ``int64_list`` (dtype int64)
  of exactly ``prod(shape)`` values, as ``tf.io.FixedLenFeature`` writes them;
* **raw bytes** (what ``pack`` writes for every array, any dtype): a ``bytes_list`` holding one
  value, the array's C-order bytes in little-endian byte order. dtype and shape are not in the
  record; they come from the spec (for packed data, from the manifest). tf.data reads them as::

      manifest = json.load(open(f"{out_dir}/manifest.json"))
      spec = {k: tf.io.FixedLenFeature([], tf.string) for k in manifest["features"]}
      def parse(record):
          ex = tf.io.parse_single_example(record, spec)
          return {k: ex[k] if f["dtype"] in ("bytes", "str")
                  else tf.reshape(tf.io.decode_raw(ex[k], f["dtype"]), f["shape"])
                  for k, f in manifest["features"].items()}
      tf.data.TFRecordDataset(sorted(glob.glob(f"{out_dir}/shard-*.tfrecord"))).map(parse)

A missing feature, a feature of another kind, count or byte size raises :class:`DataError`
naming the file, the record and the key, with what was expected and what was found.

**Packed directories** (``pack``'s output): ``TFRecordSource(out_dir)`` reads
``manifest.json`` for the shard list, record counts and feature specs, so it needs no
``features=``; a missing shard or a count that differs from the manifest is an error.
"""
from __future__ import annotations

import bisect
import functools
import glob
import hashlib
import importlib
import json
import math
import os
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import DataError
from .base import LazyHandles, file_fingerprint

INDEX_SUFFIX = ".sfidx.npy"
INDEX_TAG = 0x5346_4944_58  # "SFIDX"
INDEX_VERSION = 1
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "steadyfeed.tfrecord-dataset"
MANIFEST_VERSION = 1

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = 12  # length + its CRC
FRAMING_BYTES = 16  # header + data CRC
_MASK_DELTA = 0xA282EAD8
VARIABLE_KINDS = ("bytes", "str")
NATIVE_LISTS = {"float32": "float_list", "int64": "int64_list"}  # what tf.io.FixedLenFeature reads


# -- optional dependencies (the core needs numpy only) ------------------------------------------
def _require(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"TFRecord support needs the {package} package: pip install 'steadyfeed[tfrecord]'") from exc


@functools.lru_cache(maxsize=None)
def _crc32c():
    return _require("google_crc32c", "google-crc32c").value


def require_support() -> None:
    """ImportError now, naming what to install, rather than on the first record."""
    _crc32c()
    example_classes()


# -- framing -------------------------------------------------------------------------------------
def masked_crc(data) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = _crc32c()(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> tuple[bytes, bytes]:
    """The header and footer that surround ``data`` in a TFRecord file."""
    length = _LENGTH.pack(len(data))
    return length + _CRC.pack(masked_crc(length)), _CRC.pack(masked_crc(data))


class RecordWriter:
    """Writes records to a new file (never overwrites), keeping each one's index row."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._file = open(self.path, "xb")
        self._rows: list[tuple[int, int]] = []
        self._offset = 0

    def __len__(self) -> int:
        return len(self._rows)

    def write(self, data: bytes) -> None:
        header, footer = frame(data)
        self._file.write(header)
        self._file.write(data)
        self._file.write(footer)
        self._rows.append((self._offset, len(data)))
        self._offset += FRAMING_BYTES + len(data)

    def close(self) -> np.ndarray:
        """Flush to disk (so a published dataset survives a crash) and return the index rows."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        return np.array(self._rows, dtype=np.int64).reshape(-1, 2)


def read_record(fd: int, path: str, number: int, offset: int, length: int) -> bytes:
    """The data of record ``number`` (indexed at ``offset`` with ``length`` bytes), both CRCs verified.

    Uses ``os.pread``: no shared file position, so threads may share ``fd``.
    """
    buf = os.pread(fd, FRAMING_BYTES + length, offset)
    where = functools.partial(record_name, number, offset, path)  # formatted only for an error
    if len(buf) != FRAMING_BYTES + length:
        raise DataError(f"{where()} is truncated: expected {FRAMING_BYTES + length} bytes, the file has "
                        f"{len(buf)} there (did the file change after it was indexed?)")
    if _CRC.unpack_from(buf, 8)[0] != masked_crc(buf[:8]):
        raise DataError(f"CRC mismatch in the length of {where()}")
    declared = _LENGTH.unpack_from(buf)[0]
    if declared != length:
        raise DataError(f"{where()} declares {declared} data bytes but its index says {length} "
                        f"(did the file change after it was indexed?)")
    data = buf[HEADER_BYTES:HEADER_BYTES + length]
    if _CRC.unpack_from(buf, HEADER_BYTES + length)[0] != masked_crc(data):
        raise DataError(f"CRC mismatch in data of {where()}")
    return data


def record_name(number: int, offset: int, path: str) -> str:
    return f"record {number} at byte {offset} of {path}"


# -- offset index ---------------------------------------------------------------------------------
def scan(path: str) -> np.ndarray:
    """Index rows ``(offset, length)`` of every record, from one pass over the 12-byte headers.

    Raises DataError naming the record and byte where the framing breaks (truncation, a
    corrupt length, a length longer than what is left of the file).
    """
    rows = []
    with open(path, "rb", buffering=0) as f:
        fd, size, offset = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while offset < size:
            record = f"record {len(rows)} at byte {offset}"
            header = os.pread(fd, HEADER_BYTES, offset)
            if len(header) < HEADER_BYTES:
                raise DataError(f"{path} is truncated: it ends inside the header of {record} "
                                f"({len(header)} of {HEADER_BYTES} bytes)")
            if _CRC.unpack_from(header, 8)[0] != masked_crc(header[:8]):
                raise DataError(f"CRC mismatch in the length of {record} of {path}: not a TFRecord file, or damaged")
            length = _LENGTH.unpack_from(header)[0]
            left = size - offset - FRAMING_BYTES
            if length > left:
                raise DataError(f"{path} is truncated or damaged: {record} declares {length} data bytes "
                                f"but only {max(left, 0)} remain")
            rows.append((offset, length))
            offset += FRAMING_BYTES + length
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def index_path(path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Where the index of ``path`` is cached: beside it, or in ``cache_dir`` under a unique name."""
    if cache_dir is None:
        return path + INDEX_SUFFIX
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    return os.path.join(os.fspath(cache_dir), f"{digest}-{os.path.basename(path)}{INDEX_SUFFIX}")


def _index_header(st: os.stat_result) -> np.ndarray:
    return np.array([[INDEX_TAG, INDEX_VERSION], [st.st_size, st.st_mtime_ns]], dtype=np.int64)


def _tiles(rows: np.ndarray, size: int) -> bool:
    """Whether the rows describe back-to-back records covering exactly ``size`` bytes."""
    if len(rows) == 0:
        return size == 0
    offsets, lengths = rows[:, 0], rows[:, 1]
    ends = offsets + FRAMING_BYTES + lengths
    return bool(offsets[0] == 0 and (lengths >= 0).all() and np.array_equal(offsets[1:], ends[:-1])
                and ends[-1] == size)


def _load_cached(target: str, st: os.stat_result) -> np.ndarray | None:
    """The cached rows if the cache exists and describes the file as it is now, else None."""
    try:
        cached = np.load(target, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # missing or unreadable: rebuild
        return None
    if cached.dtype != np.int64 or cached.ndim != 2 or cached.shape[1] != 2 or len(cached) < 2:
        return None
    if not np.array_equal(cached[:2], _index_header(st)) or not _tiles(cached[2:], st.st_size):
        return None
    return cached[2:]


def save_index(path: str, rows: np.ndarray, target: str, st: os.stat_result | None = None) -> None:
    """Write the index atomically (temp file + rename): concurrent builders never see half of one."""
    st = os.stat(path) if st is None else st
    tmp = f"{target}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            np.save(f, np.concatenate([_index_header(st), rows]))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_index(path: str, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """Index rows of ``path``: from the cache when still valid, else scanned and cached."""
    st = os.stat(path)  # before the scan: a change during it makes the cache stale, never wrong
    target = index_path(path, cache_dir)
    rows = _load_cached(target, st)
    if rows is None:
        rows = scan(path)
        try:
            if cache_dir is not None:
                os.makedirs(cache_dir, exist_ok=True)
            save_index(path, rows, target, st)
        except OSError as exc:  # a read-only dataset still works, it only re-scans
            warnings.warn(f"could not cache the record index of {path} at {target} ({exc}); it will be "
                          f"rebuilt each time: pass cache_dir= to a writable directory", stacklevel=3)
    return rows


# -- tf.train.Example, without TensorFlow ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def example_classes() -> dict[str, type]:
    """Message classes wire-compatible with tensorflow/core/example/{feature,example}.proto.

    Built from a descriptor in a private pool, so they never clash with TensorFlow's own
    ``tensorflow.Example`` when both are imported.
    """
    descriptor_pb2 = _require("google.protobuf.descriptor_pb2", "protobuf")
    pool_module = _require("google.protobuf.descriptor_pool", "protobuf")
    factory = _require("google.protobuf.message_factory", "protobuf")
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="steadyfeed/tf_example.proto", package="tensorflow",
                                               syntax="proto3")

    def message(name, *fields):
        msg = proto.message_type.add(name=name)
        for field_name, number, ftype, label, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
        return msg

    repeated, optional = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, F.TYPE_BYTES, repeated, ""))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, repeated, ""))
    message("Int64List", ("value", 1, F.TYPE_INT64, repeated, ""))
    feature = message("Feature", *[(kind, n, F.TYPE_MESSAGE, optional, f".tensorflow.{cls}")
                                   for n, (kind, cls) in enumerate(
                                       [("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                        ("int64_list", "Int64List")], start=1)])
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", ("feature", 1, F.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")  # what `map<string, Feature>` compiles to
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=optional, type_name=".tensorflow.Feature")
    message("Example", ("features", 1, F.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    pool = pool_module.DescriptorPool()
    pool.Add(proto)
    names = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "Example")
    return {name: factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{name}")) for name in names}


def _dtype_name(dtype: np.dtype) -> str:
    """A portable name: "float32" for numbers and bools, the little-endian dtype string otherwise."""
    return dtype.name if dtype.kind in "biufc" else dtype.newbyteorder("<").str


@dataclass(frozen=True)
class FeatureSpec:
    """What one feature holds: ``dtype`` ("bytes", "str" or a numpy dtype name) and ``shape``."""

    dtype: str
    shape: tuple = ()

    @classmethod
    def parse(cls, key: str, spec: Any) -> "FeatureSpec":
        """From a user's spec: a FeatureSpec, "bytes", "str", a dtype, (dtype, shape) or a manifest dict."""
        try:
            if isinstance(spec, FeatureSpec):
                return spec
            if isinstance(spec, Mapping):
                spec = (spec["dtype"], spec.get("shape", ()))
            if isinstance(spec, str) and spec in VARIABLE_KINDS:
                return cls(spec)
            dtype, shape = (spec, ()) if not isinstance(spec, (tuple, list)) else spec
            if dtype in VARIABLE_KINDS:
                return cls(dtype)
            shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
            if any(d < 0 for d in shape):
                raise ValueError("negative dimension")
            dt = np.dtype(dtype)
            if dt.kind in "OV":
                raise ValueError(f"dtype {dt} has no byte encoding")
            return cls(_dtype_name(dt), shape)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"feature {key!r}: cannot read spec {spec!r} ({exc}); expected (dtype, shape) such "
                             f"as ('float32', (64, 64, 3)), a dtype for a scalar, 'bytes' or 'str'") from exc

    @classmethod
    def of(cls, value: Any) -> "FeatureSpec":
        """The spec a sample value has: bytes/str (also 0-d) are variable-length, the rest arrays."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return cls("bytes")
        if isinstance(value, str):
            return cls("str")
        arr = np.asarray(value)
        if arr.ndim == 0 and arr.dtype.kind in "SU":
            return cls("bytes" if arr.dtype.kind == "S" else "str")
        if arr.dtype.kind in "OV":
            raise DataError(f"dtype {arr.dtype} cannot be packed: use numbers, bools, bytes or str")
        return cls(_dtype_name(arr.dtype), arr.shape)

    @functools.cached_property  # a frozen dataclass still has a __dict__ for it
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    def describe(self) -> str:
        return self.dtype if self.dtype in VARIABLE_KINDS else f"{self.dtype} {self.shape}"

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    def encode(self, value: Any) -> bytes:
        """The raw bytes written for a value of this spec (checked beforehand with ``of``)."""
        if self.dtype == "bytes":
            return value.tobytes() if isinstance(value, np.ndarray) else bytes(value)
        if self.dtype == "str":
            return str(value[()] if isinstance(value, np.ndarray) else value).encode("utf-8")
        return np.asarray(value, dtype=self.np_dtype).tobytes()

    def decode(self, feature, key: str):
        """The value of a parsed ``Feature``, or DataError saying what was expected and found."""
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list" and len(feature.bytes_list.value) == 1:
            return self._from_bytes(feature.bytes_list.value[0], key)
        if kind is not None and kind == NATIVE_LISTS.get(self.dtype):
            values = getattr(feature, kind).value
            if len(values) == math.prod(self.shape):
                return np.array(values, dtype=self.np_dtype).reshape(self.shape)
        count = len(getattr(feature, kind).value) if kind else 0
        raise DataError(f"feature {key!r}: expected {self._expected()}, found {kind or 'an empty feature'} "
                        f"with {count} value(s)")

    def _from_bytes(self, raw: bytes, key: str):
        if self.dtype == "bytes":
            return raw
        if self.dtype == "str":
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"feature {key!r}: expected a UTF-8 str, found invalid UTF-8 ({exc})") from None
        dtype = self.np_dtype
        if len(raw) != dtype.itemsize * math.prod(self.shape):
            raise DataError(f"feature {key!r}: expected {self._expected()}, found a bytes_list value of "
                            f"{len(raw)} bytes")
        return np.frombuffer(raw, dtype=dtype).reshape(self.shape)

    def _expected(self) -> str:
        if self.dtype in VARIABLE_KINDS:
            return f"{self.dtype}: a bytes_list of one value"
        size = math.prod(self.shape)
        native = NATIVE_LISTS.get(self.dtype)
        also = f" or a {native} of {size} values" if native else ""
        return f"{self.describe()}: one bytes_list value of {self.np_dtype.itemsize * size} raw bytes{also}"


def parse_features(features: Mapping[str, Any]) -> dict[str, FeatureSpec]:
    return {str(key): FeatureSpec.parse(str(key), spec) for key, spec in features.items()}


def _check_mapping(sample: Any) -> None:
    if not isinstance(sample, Mapping):
        raise DataError(f"a sample must be a dict of arrays, got {type(sample).__name__}")


def infer_specs(sample: Mapping[str, Any]) -> dict[str, FeatureSpec]:
    """The specs of a sample's values (what ``pack`` records from the first sample)."""
    _check_mapping(sample)
    for key in sample:
        if not isinstance(key, str):
            raise DataError(f"sample keys must be str, got {key!r}")
    return {key: FeatureSpec.of(value) for key, value in sample.items()}


def check_sample(sample: Mapping[str, Any], specs: Mapping[str, FeatureSpec]) -> None:
    """DataError unless ``sample`` has exactly the keys of ``specs``, each with its dtype and shape."""
    _check_mapping(sample)
    if sample.keys() != specs.keys():
        raise DataError(f"keys {sorted(sample)} differ from the first sample's {sorted(specs)}")
    for key, spec in specs.items():
        found = FeatureSpec.of(sample[key])
        if found != spec:
            raise DataError(f"key {key!r}: expected {spec.describe()} (as in the first sample), "
                            f"found {found.describe()}")


def encode_example(sample: Mapping[str, Any], specs: Mapping[str, FeatureSpec]) -> bytes:
    """A serialized tf.train.Example with one raw bytes_list value per key (deterministic bytes)."""
    example = example_classes()["Example"]()
    feature_map = example.features.feature
    for key, spec in specs.items():
        feature_map[key].bytes_list.value.append(spec.encode(sample[key]))
    return example.SerializeToString(deterministic=True)


def decode_example(data: bytes, specs: Mapping[str, FeatureSpec]) -> dict:
    """The sample in a serialized tf.train.Example, one value per spec; DataError (without
    the record's location, which the caller adds) when it does not match the specs."""
    try:
        example = example_classes()["Example"].FromString(data)
    except Exception as exc:  # protobuf's DecodeError; its module is optional
        raise DataError(f"not a valid tf.train.Example ({exc})") from None
    feature_map = example.features.feature
    sample = {}
    for key, spec in specs.items():
        if key not in feature_map:  # test first: indexing a message map inserts the key
            raise DataError(f"feature {key!r} is missing (the record has {sorted(feature_map)})")
        sample[key] = spec.decode(feature_map[key], key)
    return sample


# -- manifest of a packed directory -----------------------------------------------------------------
def manifest_dict(samples: int, specs: Mapping[str, FeatureSpec], shards: Sequence[tuple[str, int]]) -> dict:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "samples": samples,
        "encoding": "one bytes_list value per feature: arrays as raw little-endian C-order bytes "
                    "(tf.io.decode_raw, then reshape), bytes as is, str as UTF-8",
        "features": {key: spec.to_json() for key, spec in specs.items()},
        "shards": [{"file": name, "records": count} for name, count in shards],
    }


def read_manifest(directory: str) -> tuple[list[str], dict[str, FeatureSpec], list[int]]:
    """(shard paths, feature specs, records per shard) of a packed directory, checked for consistency."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.exists(path):
        raise DataError(f"{directory} has no {MANIFEST_NAME}: it is not a complete steadyfeed.pack output "
                        f"(pass a glob of .tfrecord files and features= to read other TFRecord files)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
            raise ValueError(f"format {manifest.get('format')!r} version {manifest.get('version')!r}, expected "
                             f"{MANIFEST_FORMAT!r} version {MANIFEST_VERSION}")
        shards = [(s["file"], int(s["records"])) for s in manifest["shards"]]
        if any(os.path.basename(name) != name for name, _ in shards):  # shards live in the directory itself
            raise ValueError("a shard file name contains a directory")
        specs = parse_features(manifest["features"])
        samples = int(manifest["samples"])
        if samples != sum(n for _, n in shards):
            raise ValueError(f"samples {samples} is not the sum of the shards' records")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path} is not a valid steadyfeed manifest: {exc}") from exc
    return [os.path.join(directory, name) for name, _ in shards], specs, [n for _, n in shards]


# -- the source ---------------------------------------------------------------------------------------
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
    """Random access to the ``tf.train.Example`` records of TFRecord files (see the module docstring).

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

