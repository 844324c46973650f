"""What one file holds, read with the readers the sources use, so ``steadyfeed inspect``
never passes what a loader would refuse. One probe per format fills a :class:`FileInfo`;
none writes anything (no index is cached beside the data).

* images: ``ImageReader.header`` / ``load`` (ImageFolder's own decoding and refusals);
* ``.npy``: the checked header (``npy.npy_layout``), ``read_npy`` to decode;
* HDF5: every dataset's shape and dtype; variable-length strings with their lengths, refused
  under ``collate="stack"`` when the lengths differ (the loader's own rule, ``layout_conflict``);
* CSV: ``CsvSource``'s index and parser: rows, columns, each column's type and missing values;
  short or long rows and non-numbers in numeric columns are what a CsvSource refuses;
* TFRecord (GZIP / ZLIB too, decompressed into a scratch directory): the framing and both
  CRCs of every record (``framing.open_index`` / ``read_record``; a damaged tail is
  unreadable, the records before it are read), each Example's features: kinds and lengths,
  what ``TFRecordSource`` infers from the first records, and the ``--feature`` flags;
* Parquet: the footer (rows, row groups), each column's type, nulls and how ``ParquetSource``
  reads it; every row group decoded as the source decodes it;
* tar shards: ``WebDatasetSource``'s member index: samples, the extensions and their sizes,
  samples whose members differ from the others', a broken tar stream.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import quality
from ..diagnostics import image_quality
from ..errors import DataError
from ..execution.batch import conflict_fix, layout_conflict

HDF5_EXTENSIONS = (".h5", ".hdf5", ".he5")
PARQUET_EXTENSIONS = (".parquet", ".parq", ".pq")
TAR_EXTENSIONS = (".tar",)
TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfr")
CSV_ROWS_PER_READ = 4096
HDF5_ROWS_PER_READ = 65536


@dataclass
class FileInfo:
    """What one file is: its format, shapes (key -> text), image mode, or its error; what a loader
    would refuse in it (``refused``, ``unreadable``: (item, why)); its format's table."""

    size: int
    format: str
    shapes: dict[str, str] = field(default_factory=dict)
    mode: str | None = None
    error: str | None = None
    problems: list[quality.Problem] = field(default_factory=list)
    image: tuple[int, int] | None = None  # an image's (height, width), from its header
    output: tuple | None = None  # (shape, dtype) of the sample an ImageFolder makes of it
    refused: list[tuple[str, str]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # parts (records) that fail to read
    notes: list[str] = field(default_factory=list)
    table: dict | None = None
    scores: dict[str, float] = field(default_factory=dict)  # image check -> score (diagnostics/image_quality.py)


def shape_text(shape: Sequence[int], dtype: Any = None) -> str:
    text = "x".join(map(str, shape)) if len(shape) else "scalar"
    return f"{text} {np.dtype(dtype)}" if dtype is not None else text


def refusal(what: str, detail: str, collate: str, key: str = "x") -> str:
    """Why a loader refuses samples that each read fine: the loader's own conflict and fix."""
    return (
        f"{detail}: a loader with collate={collate!r} raises CollateError for a batch holding both (neither "
        f"is at fault); fix: {conflict_fix(what, key)}"
    )


# -- images --------------------------------------------------------------------------------------
def probe_image(reader, path: str, info: FileInfo, decode: bool, checks: Sequence[str]) -> None:
    header = reader.header(path)
    info.format, info.mode = header.format or info.format, header.mode
    info.shapes["image"] = shape_text((header.height, header.width, header.bands))
    info.image = (header.height, header.width)
    info.output = (reader.output_shape(header), np.dtype(np.uint8))
    if decode:
        image = reader.load(path)
        info.problems = quality.sample_problems(path, {"image": image}, checks)
        info.scores = image_scores(image, checks)


def image_scores(a: np.ndarray, checks: Sequence[str]) -> dict[str, float]:
    """The image checks' scores of one array, computed as the file is read (nothing when not an image)."""
    wanted = quality.image_checks(checks)
    if not wanted or not image_quality.is_image(a):
        return {}
    found = image_quality.scores(a)
    return {name: float(found[name][0]) for name in wanted}


# -- .npy ----------------------------------------------------------------------------------------
def probe_npy(path: str, info: FileInfo, decode: bool, checks: Sequence[str]) -> None:
    from ..sources import npy

    fd = os.open(path, os.O_RDONLY)
    try:
        layout = npy.npy_layout(fd, path)  # the header, checked against the file size; no data read
    finally:
        os.close(fd)
    info.format, info.shapes["npy"] = "npy", shape_text(layout.shape, layout.dtype)
    if decode:
        array = npy.read_npy(path)
        info.problems = quality.sample_problems(path, {"npy": array}, checks)
        info.scores = image_scores(array, checks)


# -- HDF5 ----------------------------------------------------------------------------------------
def probe_hdf5(path: str, name: str, info: FileInfo, collate: str) -> None:
    try:
        import h5py
    except ImportError:  # no h5py: an HDF5 file is a file like any other
        info.notes.append("h5py is not installed: pip install 'steadyfeed[hdf5]' to see the datasets")
        return
    rows: list[dict] = []
    with h5py.File(path, "r") as f:
        info.format = "hdf5"
        f.visititems(
            lambda key, obj: rows.append(_dataset_row(h5py, f"/{key}", obj)) if isinstance(obj, h5py.Dataset) else None
        )
    for row in rows:
        info.shapes[row["dataset"]] = f"{row['shape']} {row['dtype']}"
        lengths = row.pop("lengths", None)
        what = lengths and layout_conflict(((), np.dtype(f"S{lengths[0]}")), ((), np.dtype(f"S{lengths[1]}")), collate)
        if what:
            info.refused.append(
                (
                    f"{name} {row['dataset']}",
                    refusal(what, f"variable-length strings of {lengths[0]} to {lengths[1]} bytes", collate),
                )
            )
    info.table = {"datasets": rows}


def _dataset_row(h5py, key: str, ds) -> dict:
    row: dict[str, Any] = {"dataset": key, "shape": shape_text(ds.shape), "dtype": str(ds.dtype), "note": ""}
    string = h5py.check_string_dtype(ds.dtype)
    if string is not None and string.length is None:  # variable-length: as bytes, as Hdf5Source reads them
        lo, hi = _vlen_lengths(ds)
        row["dtype"] = f"vlen str ({string.encoding})"
        row["note"] = f"{lo}..{hi} bytes" if lo != hi else f"{lo} bytes each"
        row["lengths"] = (lo, hi)
    if ds.ndim == 0:
        row["note"] = "a scalar: Hdf5Source reads datasets with one row per sample"
    return row


def _vlen_lengths(ds) -> tuple[int, int]:
    """The shortest and longest value (in bytes) of a variable-length string dataset."""
    lo, hi = math.inf, 0
    for start in range(0, max(ds.shape[0] if ds.ndim else 1, 1), HDF5_ROWS_PER_READ):
        values = np.asarray(ds[start : start + HDF5_ROWS_PER_READ] if ds.ndim else ds[()]).reshape(-1)
        lengths = [len(v) for v in values]
        lo, hi = min([lo, *lengths]), max([hi, *lengths])
    return (0 if lo is math.inf else int(lo)), int(hi)


# -- CSV -----------------------------------------------------------------------------------------
@dataclass
class _Column:
    name: str
    missing: int = 0
    numbers: int = 0
    integers: int = 0
    text: list = field(default_factory=list)  # (row, value) of values that are no number

    @property
    def kind(self) -> str:
        if self.numbers == 0 and not self.text:
            return "empty"
        if len(self.text) * 2 > len(self.text) + self.numbers:
            return "text"
        return "int" if self.integers == self.numbers else "float"


def _classify(column: _Column, i: int, value: str) -> None:
    from ..sources.csv_rows import NA_VALUES

    if value in NA_VALUES:  # what CsvSource reads as missing: NaN in a float key
        column.missing += 1
        return
    v = value.strip()
    try:
        float(v)
    except ValueError:
        column.text.append((i, value))
        return
    column.numbers += 1
    column.integers += v.lstrip("+-").isdigit()


def probe_csv(path: str, name: str, info: FileInfo) -> None:
    from ..sources.csv_rows import CsvSource

    with tempfile.TemporaryDirectory() as scratch:  # the row index: not beside the data
        source = CsvSource(path, cache_dir=scratch, _=0)
        info.format = "csv"
        assert source.columns is not None  # read with a header
        columns, refused = [_Column(c) for c in source.columns], []
        for start in range(0, len(source), CSV_ROWS_PER_READ):
            ids = range(start, min(start + CSV_ROWS_PER_READ, len(source)))
            for i, fields in zip(ids, source.records(ids)):
                try:
                    source.check_fields(i, fields)
                except DataError as exc:  # its message starts with where: the item says that
                    refused.append((i, str(exc).removeprefix(f"{source.locate(i)}: ")))
                    continue
                for column, value in zip(columns, fields):
                    _classify(column, i, value)
        for column in columns:
            if column.kind in ("int", "float"):  # a numeric column's non-numbers are refused rows
                refused += [
                    (
                        i,
                        f"column {column.name!r}: {value!r} is not a number; a CsvSource reading this "
                        f"column refuses the row",
                    )
                    for i, value in column.text
                ]
        info.refused += [(source.locate(i).replace(path, name, 1), why) for i, why in sorted(refused)]
        info.table = {
            "rows": len(source),
            "columns": [{"name": c.name, "type": c.kind, "missing": c.missing, "note": _csv_note(c)} for c in columns],
        }
        source.close()


def _csv_note(column: _Column) -> str:
    if column.kind == "text":
        return "text: read it as class ids with --dtype KEY=class"
    if column.kind == "int" and column.missing:
        return "missing values: NaN as float32, or fill= for an integer key"
    return ""


# -- TFRecord --------------------------------------------------------------------------------------
_DTYPES = {"float_list": "float32", "int64_list": "int64", "bytes_list": "bytes"}


def looks_like_tfrecord(path: str) -> bool:
    """A ``.tfrecord``-like name, or a first record header whose length CRC checks out."""
    if path.lower().endswith(TFRECORD_EXTENSIONS) or ".tfrecord" in os.path.basename(path).lower():
        return True
    from ..sources.tfrecord import HEADER_BYTES, masked_crc

    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    return len(head) == HEADER_BYTES and int.from_bytes(head[8:], "little") == masked_crc(head[:8])


@dataclass
class _Feature:
    kinds: Counter = field(default_factory=Counter)
    values: list = field(default_factory=list)  # per record that has it
    bytes: list = field(default_factory=list)
    missing: list = field(default_factory=list)  # record numbers without it


def probe_tfrecord(path: str, name: str, info: FileInfo) -> None:
    from ..sources.tfrecord import INFER_RECORDS, feature_kinds, infer_features, open_index, read_record

    features: dict[str, _Feature] = {}
    first: list[bytes] = []
    with tempfile.TemporaryDirectory() as scratch:  # the index (and a decompressed copy): not beside the data
        index = open_index(path, None, scratch)
        info.format = "tfrecord"
        fd = os.open(index.data_path, os.O_RDONLY)
        try:
            for r, (offset, length) in enumerate(index.rows.tolist()):
                try:
                    data = read_record(fd, index.name, r, offset, length)
                    kinds = feature_kinds(data)
                except DataError as exc:
                    info.unreadable.append((f"{name} record {r}", str(exc)))
                    continue
                if len(first) < INFER_RECORDS:
                    first.append(data)
                _tally(features, kinds, r)
            if index.damaged:
                info.unreadable.append((f"{name} record {len(index.rows)}", str(index.damage_error(fd))))
        finally:
            os.close(fd)
    records = len(index.rows)
    try:
        inferred, notes = infer_features(first)
    except DataError as exc:
        inferred, notes = {}, [str(exc)]
    info.notes += notes
    info.table = {
        "records": records,
        "compression": index.compression or "none",
        "features": [_feature_row(key, f, records, inferred.get(key)) for key, f in sorted(features.items())],
    }
    info.table["read_with"] = " ".join(f"--feature {row['suggested']}" for row in info.table["features"])
    info.refused += [
        (f"{name} feature {key!r}", why) for key, f in sorted(features.items()) if (why := _feature_refusal(key, f))
    ]


def _tally(features: dict[str, _Feature], kinds: dict, r: int) -> None:
    for key in kinds.keys() - features.keys():
        features[key] = _Feature(missing=list(range(r)))  # not in the records before
    for key, feature in features.items():
        if key not in kinds:
            feature.missing.append(r)
            continue
        kind, count, size = kinds[key]
        feature.kinds[kind] += 1
        feature.values.append(count)
        if size is not None:
            feature.bytes.append(size)


def _span(values: list) -> str:
    return "-" if not values else str(values[0]) if min(values) == max(values) else f"{min(values)}..{max(values)}"


def _feature_row(key: str, f: _Feature, records: int, inferred=None) -> dict:
    kind = f.kinds.most_common(1)[0][0] if f.kinds else "empty"
    dtype = _DTYPES.get(kind, "bytes")
    varying = len(set(f.values)) > 1
    if dtype == "bytes":
        suggested, shape = f"{key}=bytes", ""
        note = "" if set(f.values) <= {1} else f"{_span(f.values)} values: TFRecordSource reads a bytes_list of one"
    else:
        shape = ":?" if varying else "" if set(f.values) <= {1} else f":{f.values[0]}"
        suggested = f"{key}={dtype}{shape}"
        note = f"{_span(f.values)} values: read it with --feature {suggested} and --collate pad" if varying else ""
    return {
        "feature": key,
        "kind": "/".join(sorted(f.kinds)) or kind,
        "values": _span(f.values),
        "bytes": _span(f.bytes),
        "records": records - len(f.missing),
        "inferred": inferred.describe() if inferred is not None else "-",
        "suggested": suggested,
        "note": note,
    }


def _feature_refusal(key: str, f: _Feature) -> str | None:
    if len(f.kinds) > 1:
        kinds = ", ".join(f"{k} in {n} records" for k, n in f.kinds.most_common())
        return f"feature {key!r} is of more than one kind ({kinds}): a TFRecordSource reading it refuses the others"
    if f.missing:
        shown = ", ".join(map(str, f.missing[:8])) + (", ..." if len(f.missing) > 8 else "")
        return (
            f"feature {key!r} is missing from {len(f.missing)} record(s) ({shown}): a TFRecordSource "
            f"reading it refuses them"
        )
    return None


# -- Parquet ----------------------------------------------------------------------------------------
def probe_parquet(path: str, name: str, info: FileInfo) -> None:
    from ..sources.parquet import ParquetSource, column_reader, pyarrow_module

    pq = pyarrow_module().parquet
    meta = pq.read_metadata(path)
    schema = meta.schema.to_arrow_schema()
    info.format = "parquet"
    rows, readable = [], []
    for c, field_ in enumerate(schema):
        nulls = [meta.row_group(g).column(c).statistics for g in range(meta.num_row_groups)]
        counted = [s.null_count for s in nulls if s is not None and s.has_null_count]
        try:
            column = column_reader(field_.name, field_.type)
            note = {
                "number": "a scalar",
                "fixed": f"an array {column.shape}",
                "list": "1-D, any length (collate pad)",
                "string": "str",
                "binary": "bytes",
            }[column.kind]
            readable.append(field_.name)
        except DataError as exc:
            note = f"not read: {str(exc).split(': ', 1)[-1]}"
        rows.append(
            {
                "name": field_.name,
                "type": str(field_.type),
                "nulls": sum(counted) if len(counted) == len(nulls) else "?",
                "note": note,
            }
        )
        info.shapes[field_.name] = str(field_.type)
    info.table = {"rows": meta.num_rows, "row_groups": meta.num_row_groups, "columns": rows}
    if readable:
        source = ParquetSource(path, **{c: c for c in readable})
        try:
            for g in range(meta.num_row_groups):
                try:
                    source.read_row_group(g)  # decoded as the source decodes it, uncached
                except DataError as exc:
                    info.unreadable.append((f"{name} row group {g}", str(exc)))
        finally:
            source.close()


# -- WebDataset tar shards ----------------------------------------------------------------------------
def probe_tar(path: str, name: str, info: FileInfo) -> None:
    from ..sources.webdataset import WebDatasetSource

    with tempfile.TemporaryDirectory() as scratch:
        source = WebDatasetSource(path, cache_dir=scratch)
        info.format = "webdataset"
        sizes: dict[str, list[int]] = {}
        layouts: Counter = Counter()
        per_sample: dict[int, tuple] = {}
        for i in range(len(source)):
            try:
                members = source.members(i)
            except DataError as exc:
                info.unreadable.append((source.locate(i).replace(path, name, 1), str(exc)))
                continue
            for ext, (_, size) in members.items():
                sizes.setdefault(ext, []).append(size)
            per_sample[i] = tuple(sorted(members))
            layouts[per_sample[i]] += 1
        source.close()
        if layouts:
            common, count = layouts.most_common(1)[0]
            for i, exts in per_sample.items():
                if exts != common:
                    info.refused.append(
                        (
                            source.locate(i).replace(path, name, 1),
                            f"members {list(exts)} where {count} samples have {list(common)}: a "
                            f"WebDatasetSource reading every member gives it other keys (choose them "
                            f"with keys=)",
                        )
                    )
        info.table = {
            "samples": len(per_sample),
            "members": [
                {"extension": ext, "samples": len(v), "bytes": _span(sorted(v))} for ext, v in sorted(sizes.items())
            ],
        }
