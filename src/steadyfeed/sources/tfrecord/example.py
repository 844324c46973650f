"""``tf.train.Example`` without TensorFlow: the message classes, feature specs, and the
encoding of a sample as one Example.

**Features**: ``features`` maps each output key to a spec: ``(dtype, shape)`` such as
``("float32", (64, 64, 3))`` or ``("int64", ())``; a dtype string alone (a scalar); or
``"bytes"`` / ``"str"`` for one variable-length value returned as Python ``bytes`` / ``str``.
One dimension may be ``None``: it takes whatever length the record has, e.g.
``("int64", (None,))`` for a token list of any length or ``("float32", (None, 4))`` for boxes,
which ``Loader(collate="pad")`` batches (``"<key>_shape"`` holds each row's true shape).
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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DataError
from .optional import require

VARIABLE_KINDS = ("bytes", "str")
NATIVE_LISTS = {"float32": "float_list", "int64": "int64_list"}  # what tf.io.FixedLenFeature reads
# how TensorFlow stores them
_LIST_DTYPES: dict[str, np.dtype] = {"float_list": np.dtype("float32"), "int64_list": np.dtype("int64")}


@functools.cache
def example_classes() -> dict[str, Any]:  # protobuf message classes, made at run time
    """Message classes wire-compatible with tensorflow/core/example/{feature,example}.proto.

    Built from a descriptor in a private pool, so they never clash with TensorFlow's own
    ``tensorflow.Example`` when both are imported.
    """
    descriptor_pb2 = require("google.protobuf.descriptor_pb2", "protobuf")
    pool_module = require("google.protobuf.descriptor_pool", "protobuf")
    factory = require("google.protobuf.message_factory", "protobuf")
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="steadyfeed/tf_example.proto", package="tensorflow", syntax="proto3"
    )

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
    feature = message(
        "Feature",
        *[
            (kind, n, F.TYPE_MESSAGE, optional, f".tensorflow.{cls}")
            for n, (kind, cls) in enumerate(
                [("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")], start=1
            )
        ],
    )
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
    def parse(cls, key: str, spec: Any) -> FeatureSpec:
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
            shape = (shape,) if isinstance(shape, int) or shape is None else tuple(shape)
            shape = tuple(None if d is None or d == -1 else int(d) for d in shape)  # -1: numpy's "any length"
            if any(d is not None and d < 0 for d in shape) or shape.count(None) > 1:
                raise ValueError("a dimension must be >= 0, or None / -1 (any length) for at most one")
            dt = np.dtype(dtype)
            if dt.kind in "OV":
                raise ValueError(f"dtype {dt} has no byte encoding")
            return cls(_dtype_name(dt), shape)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(
                f"feature {key!r}: cannot read spec {spec!r} ({exc}); expected (dtype, shape) such "
                f"as ('float32', (64, 64, 3)), a dtype for a scalar, 'bytes' or 'str'"
            ) from exc

    @classmethod
    def of(cls, value: Any) -> FeatureSpec:
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

    @property
    def stacks(self) -> bool:
        """A number array of one shape in every record (no ``None`` dimension, not bytes/str):
        what a batch of records reads straight into one preallocated array."""
        return self.dtype not in VARIABLE_KINDS and None not in self.shape and self.np_dtype.kind in "biufc"

    @property
    def fixed_size(self) -> int:
        """Values per record, not counting a ``None`` dimension (whose length each record sets)."""
        return math.prod(d for d in self.shape if d is not None)

    def _shaped(self, values: np.ndarray):
        """``values`` (one dimension) in this spec's shape, or None when their count does not fit."""
        n, fixed = len(values), self.fixed_size
        if None not in self.shape:
            return values.reshape(self.shape) if n == fixed else None
        if fixed == 0 or n % fixed:
            return None
        return values.reshape(tuple(-1 if d is None else d for d in self.shape))

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

    @property
    def native_list(self) -> str | None:
        """The TensorFlow list kind this spec also reads: a float_list for float32 / float64, an
        int64_list for any integer or bool dtype (each value checked to fit)."""
        if self.dtype in VARIABLE_KINDS:
            return None
        kind = self.np_dtype.kind
        return "float_list" if self.dtype in ("float32", "float64") else "int64_list" if kind in "iub" else None

    def decode(self, feature, key: str):
        """The value of a parsed ``Feature``, or DataError saying what was expected and found."""
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list" and len(feature.bytes_list.value) == 1:
            return self._from_bytes(feature.bytes_list.value[0], key)
        count = len(getattr(feature, kind).value) if kind else 0
        if kind is not None and kind == self.native_list:
            shaped = self._shaped(self._cast(np.array(getattr(feature, kind).value, dtype=_LIST_DTYPES[kind]), key))
            if shaped is not None:
                return shaped
        hint = ""
        if kind == self.native_list and None not in self.shape:
            hint = f"; declare ({self.dtype!r}, (None,)) for a list of any length"
        raise DataError(
            f"feature {key!r}: expected {self._expected()}, found {kind or 'an empty feature'} "
            f"with {count} value(s){hint}"
        )

    def _cast(self, values: np.ndarray, key: str) -> np.ndarray:
        """A native list's values as this spec's dtype; DataError naming the first value that does not fit."""
        dtype = self.np_dtype
        if values.dtype == dtype:
            return values
        if dtype.kind in "iub":
            low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
            bad = np.flatnonzero((values < low) | (values > high))
            if bad.size:
                raise DataError(
                    f"feature {key!r}: value {values[bad[0]]} (at index {bad[0]}) does not fit "
                    f"{self.dtype} ({low}..{high}); declare a wider dtype such as int64"
                )
        return values.astype(dtype)

    def default(self, value: Any, key: str):
        """``value`` as this spec's value for a record that lacks the feature; ValueError when it cannot be."""
        if self.dtype == "bytes":
            return bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")
        if self.dtype == "str":
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        values = np.asarray(value).reshape(-1)
        try:
            if values.dtype.kind in "iub":
                values = self._cast(values.astype(np.int64), key)
            shaped = self._shaped(values.astype(self.np_dtype))
        except (DataError, ValueError, TypeError) as exc:
            raise ValueError(f"defaults[{key!r}]: {exc}") from None
        if shaped is None:
            raise ValueError(f"defaults[{key!r}]: {value!r} does not have the shape of {self.describe()}")
        return shaped

    def _from_bytes(self, raw: bytes, key: str):
        if self.dtype == "bytes":
            return raw
        if self.dtype == "str":
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"feature {key!r}: expected a UTF-8 str, found invalid UTF-8 ({exc})") from None
        dtype = self.np_dtype
        shaped = None if len(raw) % dtype.itemsize else self._shaped(np.frombuffer(raw, dtype=dtype))
        if shaped is None:
            raise DataError(
                f"feature {key!r}: expected {self._expected()}, found a bytes_list value of {len(raw)} bytes"
            )
        return shaped

    def _expected(self) -> str:
        if self.dtype in VARIABLE_KINDS:
            return f"{self.dtype}: a bytes_list of one value"
        size, native = self.fixed_size, self.native_list
        if None in self.shape:
            count = "any number of values" if size == 1 else f"a multiple of {size} values"
            raw = f"a multiple of {self.np_dtype.itemsize * size}"
        else:
            count, raw = f"{size} values", f"{self.np_dtype.itemsize * size}"
        also = f" or a {native} of {count}" if native else ""
        return f"{self.describe()}: one bytes_list value of {raw} raw bytes{also}"


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
            raise DataError(
                f"key {key!r}: expected {spec.describe()} (as in the first sample), found {found.describe()}"
            )


def encode_example(sample: Mapping[str, Any], specs: Mapping[str, FeatureSpec]) -> bytes:
    """A serialized tf.train.Example with one raw bytes_list value per key (deterministic bytes)."""
    example = example_classes()["Example"]()
    feature_map = example.features.feature
    for key, spec in specs.items():
        feature_map[key].bytes_list.value.append(spec.encode(sample[key]))
    return example.SerializeToString(deterministic=True)


def parse_example(data: bytes):
    """A serialized tf.train.Example as its message; DataError when it is not one."""
    try:
        return example_classes()["Example"].FromString(data)
    except Exception as exc:  # protobuf's DecodeError; its module is optional
        raise DataError(f"not a valid tf.train.Example ({exc})") from None


def feature_kinds(data: bytes) -> dict[str, tuple[str, int, int | None]]:
    """What each feature of a serialized Example holds, without a spec: ``(kind, values,
    bytes)``: its list kind ("bytes_list", "float_list", "int64_list", or "empty"), how many
    values, and for a bytes_list the total bytes (what ``steadyfeed inspect`` tallies)."""
    out = {}
    for key, feature in parse_example(data).features.feature.items():
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else ()
        out[key] = (kind or "empty", len(values), sum(map(len, values)) if kind == "bytes_list" else None)
    return out


def decode_example(data: bytes, specs: Mapping[str, FeatureSpec], defaults: Mapping[str, Any] | None = None) -> dict:
    """The sample in a serialized tf.train.Example, one value per spec (``defaults[key]`` where a
    record lacks the feature, or holds an empty one); DataError (without the record's location,
    which the caller adds) when it does not match the specs."""
    feature_map = parse_example(data).features.feature
    defaults = defaults or {}
    sample = {}
    for key, spec in specs.items():
        # test first: indexing a message map inserts the key
        feature = feature_map[key] if key in feature_map else None
        if key in defaults and (feature is None or feature.WhichOneof("kind") is None):
            sample[key] = defaults[key]
            continue
        if feature is None:
            raise DataError(
                f"feature {key!r} is missing (the record has {sorted(feature_map)}); pass "
                f"defaults={{{key!r}: ...}} for records without it"
            )
        sample[key] = spec.decode(feature, key)
    return sample


# -- a batch of records straight into arrays: the layout of records that differ only in their values --
def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ValueError when it does not end before ``end``."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if byte < 0x80:
            return value, pos
    raise ValueError("a varint runs past its message")


def _fields(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, value start, value end)`` of each field of the message in
    ``data[start:end]`` (protobuf wire format); ValueError when it is not well-formed."""
    fields = []
    pos = start
    while pos < end:
        tag, pos = _varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value_start, (_, value_end) = pos, _varint(data, pos, end)
        elif wire == 2:
            size, value_start = _varint(data, pos, end)
            value_end = value_start + size
        elif wire in (1, 5):
            value_start, value_end = pos, pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire}")
        if value_end > end:
            raise ValueError("a field runs past its message")
        fields.append((number, wire, value_start, value_end))
        pos = value_end
    return fields


def _one(fields: list[tuple[int, int, int, int]], number: int) -> tuple[int, int]:
    """Where the value of the message's only field, ``number`` of wire type 2, lies; ValueError else."""
    if len(fields) != 1 or fields[0][:2] != (number, 2):
        raise ValueError(f"expected one field {number}")
    return fields[0][2], fields[0][3]


def _payloads(data: bytes, keys: set) -> dict[str, tuple[int, int]]:
    """Where the one bytes_list value of each of ``keys`` lies in a serialized Example (start,
    end), found by walking its wire format; ValueError for any other layout (a key twice, a
    feature of another kind, fields Example does not have). Only a guess until proven (see
    :class:`RecordLayout`)."""
    features = _one(_fields(data, 0, len(data)), 1)
    payloads, seen = {}, set()
    for number, wire, start, end in _fields(data, *features):
        if (number, wire) != (1, 2):
            raise ValueError("Features holds a field other than its map")
        entry = {field[0]: field for field in _fields(data, start, end)}
        if sorted(entry) != [1, 2] or entry[1][1] != 2 or entry[2][1] != 2:
            raise ValueError("a map entry is not one key and one value")
        key = data[entry[1][2] : entry[1][3]].decode("utf-8")
        if key in seen:
            raise ValueError(f"key {key!r} twice")
        seen.add(key)
        if key in keys:
            bytes_list = _one(_fields(data, entry[2][2], entry[2][3]), 1)
            payloads[key] = _one(_fields(data, *bytes_list), 1)
    if payloads.keys() != keys:
        raise ValueError("a feature is missing")
    return payloads


class RecordLayout:
    """Where each feature's raw bytes lie in records that differ from a first one only there.

    ``pack`` writes every record of a dataset with the same bytes but for the values of its
    features (each one bytes_list value of a fixed size), so a batch can copy those values
    straight into its arrays without parsing each record. Exact by construction:

    * learnt from a record (``learn``) that decodes with the specs, by walking its wire
      format to each feature's value, then **proven** with protobuf itself: two probes, the
      record with every value replaced by random bytes and then by their complement, must
      decode (``decode_example``) to exactly the bytes put there, or no layout is kept;
    * a record is read through the layout only when it has the first record's length and the
      same bytes everywhere outside the values (``matches``): protobuf then parses it as it
      parsed the probes (bytes inside a bytes field are never interpreted), so the bytes
      copied are the values ``decode_example`` returns. Any other record is parsed.

    Only for specs that ``stack`` in the machine's byte order (little-endian): the raw bytes
    are then the array's bytes.
    """

    def __init__(self, template: bytes, payloads: dict[str, tuple[int, int]]):
        self.size = len(template)
        self.payloads = payloads
        spans = sorted(payloads.values())
        if any(end > start for (_, end), (start, _) in zip(spans, spans[1:])):
            raise ValueError("values overlap")
        edges = [0, *(edge for span in spans for edge in span), len(template)]
        # the bytes between the values: what every record read through the layout must repeat
        self.gaps = [(a, b, template[a:b]) for a, b in zip(edges[::2], edges[1::2]) if b > a]

    @classmethod
    def learn(cls, data: bytes, specs: Mapping[str, FeatureSpec]) -> RecordLayout | None:
        """The layout of ``data`` (a record that ``decode_example`` reads with ``specs``), proven
        exact, or None where it has none (a native list, a feature of variable size, an
        unusual encoding, a big-endian machine)."""
        if not specs or not all(spec.stacks and spec.np_dtype.isnative for spec in specs.values()):
            return None
        try:
            layout = cls(data, _payloads(data, set(specs)))
        except (ValueError, IndexError):
            return None
        return layout if layout._proven(specs, data) else None

    def _proven(self, specs: Mapping[str, FeatureSpec], data: bytes) -> bool:
        """Whether protobuf decodes the record with random values (then their complement) put in
        the layout's places to exactly those values."""
        probe = bytearray(data)
        fill = np.random.default_rng().integers(0, 256, len(data), dtype=np.uint8)
        for values in (fill, ~fill):
            for start, end in self.payloads.values():
                probe[start:end] = values[start:end].tobytes()
            try:
                sample = decode_example(bytes(probe), specs)
            except DataError:
                return False
            for key, (start, end) in self.payloads.items():
                value = sample[key]
                if value.nbytes != end - start or value.tobytes() != bytes(probe[start:end]):
                    return False
        return True

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` repeats the template everywhere outside the values."""
        return len(data) == self.size and all(data[a:b] == gap for a, b, gap in self.gaps)


def infer_features(records: Sequence[bytes]) -> tuple[dict[str, FeatureSpec], list[str]]:
    """The specs that read the features of serialized Examples, inferred from them: a float_list
    is float32, an int64_list int64, a bytes_list of one value bytes; a list holding one value
    in every record is a scalar, ``n`` values in every record shape ``(n,)``, else ``(None,)``
    (any length: batch it with ``collate="pad"``). Also notes on the features left out (a
    bytes_list of several values, a feature never set). DataError for a feature of two kinds."""
    kinds: dict[str, dict[str, set]] = {}
    for data in records:
        for key, (kind, count, _) in feature_kinds(data).items():
            kinds.setdefault(key, {}).setdefault(kind, set()).add(count)
    specs, notes = {}, []
    for key, found in sorted(kinds.items()):
        found.pop("empty", None)
        if len(found) > 1:
            raise DataError(
                f"feature {key!r} is a {' in some of the first records and a '.join(sorted(found))} in "
                f"others: pass features= to say how to read it"
            )
        if not found:
            notes.append(f"feature {key!r} is empty in the first {len(records)} record(s): left out")
            continue
        ((kind, counts),) = found.items()
        if kind == "bytes_list":
            if counts == {1}:
                specs[key] = FeatureSpec("bytes")
            else:
                notes.append(
                    f"feature {key!r} is a bytes_list of {min(counts)}..{max(counts)} values: left out "
                    f"(a bytes feature is one value)"
                )
            continue
        shape = () if counts == {1} else (counts.pop(),) if len(counts) == 1 and 0 not in counts else (None,)
        specs[key] = FeatureSpec(_LIST_DTYPES[kind].name, shape)
    return specs, notes
