"""ParquetSource: random access by row to Parquet files (``parquet`` extra: pyarrow).

Parquet stores rows in row groups, each column of a group compressed on its own; the file's
footer lists every group's row count. The source reads only those footers when it is made
(``pyarrow.parquet.read_metadata``), so sample ``i`` maps to (file, row group, row) by a
binary search, and reading it decodes only the columns it needs of only its row group
(``ParquetFile.read_row_group``): never a whole file. Decoded row groups are kept in a small
per-process cache (``cache_bytes``), so the rows of one group read in order cost one decode;
a shuffled epoch over row groups of ``R`` rows decodes up to one group per sample. Write
files with row groups sized for the access you need (``pyarrow.parquet.write_table(...,
row_group_size=...)``), or pack them (``steadyfeed pack``) for fully random access.

Columns: integers, floats and bools (a scalar per row; a float null is NaN), fixed-size
lists (``pa.list_(pa.float32(), 3)``, nested for more dimensions: arrays of that shape),
variable-length lists of numbers (1-D arrays of each row's length: ``collate="pad"``),
strings (``str``) and binary (``bytes``, e.g. encoded images for ``decode_image``). A null
anywhere else is an error naming the file, row and column, unless ``fill={key: value}``
gives its value.

Guarantees: the files' schemas are checked when the source is made (a missing column, or a
column of another type in one file, is a :class:`DataError` naming the file); handles are
opened lazily, per process and thread (the source pickles as paths and footer counts);
reads are deterministic, so batches are bit-identical at any worker count and mode.
"""

from __future__ import annotations

import bisect
import collections
import glob
import hashlib
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from .base import LazyHandles, file_fingerprint

DEFAULT_CACHE_BYTES = 256 << 20  # decoded row groups kept per process
EXTENSIONS = (".parquet", ".parq", ".pq")


def pyarrow_module():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ImportError("ParquetSource needs pyarrow: pip install 'steadyfeed[parquet]'") from exc
    return pyarrow


def parquet_files(paths: Any) -> list[str]:
    """The files ``paths`` names, sorted: a file, a glob, a directory (its Parquet files,
    recursively; names starting with "." or "_" such as ``_SUCCESS`` left out), or a list."""
    if not isinstance(paths, (str, os.PathLike)):
        files = sorted(os.fspath(p) for p in paths)
        if not files:
            raise DataError("ParquetSource got an empty list of files: expected at least one Parquet file")
        return files
    pattern = os.path.expanduser(os.fspath(paths))
    if os.path.isdir(pattern):
        files = sorted(
            os.path.join(d, f)
            for d, dirs, names in os.walk(pattern, followlinks=True)
            for f in names
            if f.lower().endswith(EXTENSIONS)
            and not f.startswith((".", "_"))
            and not any(
                part.startswith((".", "_")) for part in os.path.relpath(d, pattern).split(os.sep) if part != "."
            )
        )
        if not files:
            raise DataError(f"{pattern} holds no Parquet files (expected names ending in {', '.join(EXTENSIONS)})")
        return files
    if glob.has_magic(pattern):
        files = sorted(glob.glob(pattern))
        if not files:
            raise DataError(f"no files match {pattern!r}: expected Parquet files")
        return files
    if not os.path.isfile(pattern):
        raise FileNotFoundError(f"Parquet file not found: {pattern}")
    return [pattern]


@dataclass(frozen=True)
class _Column:
    """How one Parquet column becomes sample values: ``kind`` is "number", "fixed" (an array of
    ``shape``), "list" (1-D, any length), "string" or "binary"."""

    name: str
    type_text: str  # the Arrow type, as pyarrow writes it: what every file must have
    kind: str
    dtype: np.dtype | None = None
    shape: tuple = ()

    @property
    def stacks(self) -> bool:
        """Whether every row has one shape and dtype (else batches follow the loader's collate policy)."""
        return self.kind in ("number", "fixed")


def column_reader(name: str, arrow_type) -> _Column:
    pa = pyarrow_module()
    t = pa.types
    if t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type):
        return _Column(name, str(arrow_type), "number", np.dtype(arrow_type.to_pandas_dtype()))
    if t.is_fixed_size_list(arrow_type):
        inner = column_reader(name, arrow_type.value_type)
        if inner.kind not in ("number", "fixed"):
            raise DataError(f"column {name!r}: a fixed-size list of {arrow_type.value_type}: expected numbers")
        return _Column(name, str(arrow_type), "fixed", inner.dtype, (arrow_type.list_size, *inner.shape))
    if t.is_list(arrow_type) or t.is_large_list(arrow_type):
        inner = column_reader(name, arrow_type.value_type)
        if inner.kind != "number":
            raise DataError(f"column {name!r}: a list of {arrow_type.value_type}: expected a list of numbers")
        return _Column(name, str(arrow_type), "list", inner.dtype, (None,))
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return _Column(name, str(arrow_type), "string")
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_fixed_size_binary(arrow_type):
        return _Column(name, str(arrow_type), "binary")
    raise DataError(
        f"column {name!r} is {arrow_type}: ParquetSource reads numbers, fixed-size lists, lists of "
        f"numbers, strings and binary"
    )


@dataclass(frozen=True)
class _Key:
    """One key of a sample: its columns (several numbers stack into a vector) and its fill value."""

    columns: tuple
    vector: bool
    fill: Any = None

    @property
    def stacks(self) -> bool:
        return all(c.stacks for c in self.columns)


class _Group:
    """One decoded row group: per column, its values (numpy, or a Python list for lists, strings
    and binary) and which rows are null."""

    def __init__(self, table, columns: dict[str, _Column]):
        self.values, self.nulls, self.nbytes = {}, {}, 0
        for name, column in columns.items():
            array = table.column(name).combine_chunks()
            self.nulls[name] = np.asarray(array.is_null(), dtype=bool) if array.null_count else None
            self.values[name] = _decoded(array, column)
            self.nbytes += array.nbytes


def _decoded(array, column: _Column):
    """A column of one row group as numpy (numbers; fixed-size lists without nulls, as one block),
    else one Python value per row. Null rows hold placeholders: they are refused or filled."""
    if column.kind == "number":
        return array.to_numpy(zero_copy_only=False)
    if column.kind == "fixed" and array.null_count == 0:
        flat = array
        for _ in column.shape:
            flat = flat.flatten()
        return flat.to_numpy(zero_copy_only=False).reshape(len(array), *column.shape)
    return array.to_pylist()


class _RowGroups:
    """Decoded row groups, least recently used dropped past ``max_bytes``; per process, shared by
    its threads (a worker process starts with an empty cache: it never pickles its contents)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._groups: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, g: int, load) -> _Group:
        with self._lock:
            group = self._groups.get(g)
            if group is not None:
                self._groups.move_to_end(g)
                return group
        group = load(g)  # outside the lock: threads decode different groups at once
        with self._lock:
            if g not in self._groups:
                self._groups[g] = group
                self._bytes += group.nbytes
            while self._bytes > self.max_bytes and len(self._groups) > 1:
                _, old = self._groups.popitem(last=False)
                self._bytes -= old.nbytes
        return group

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()
            self._bytes = 0

    def __getstate__(self) -> dict:
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        _RowGroups.__init__(self, state["max_bytes"])


def _open_parquet(key):
    path, _thread = key  # one handle per thread: a ParquetFile is not documented as thread-safe
    return pyarrow_module().parquet.ParquetFile(path)


class ParquetSource:
    """Rows of Parquet files (see the module docstring for the guarantees).

    ``ParquetSource(paths, *, fill=None, cache_bytes=256 MiB, **keys)``

    ``paths``: a file, a glob, a directory (its Parquet files, recursively) or a list; sample
    ``i`` is row ``i`` counting across the files in sorted order. Each keyword in ``keys``
    names a key of the sample and selects a column by name, or a list of number columns
    that stack into a vector (their common dtype); without keys every column is a key of its
    own name. ``fill`` maps keys to the value a null takes.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        /,
        *,
        fill: dict | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        **keys: str | Sequence[str],
    ) -> None:
        pq = pyarrow_module().parquet
        self.paths = parquet_files(paths)
        metas = []
        for path in self.paths:
            try:
                metas.append(pq.read_metadata(path))
            except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
                raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
        schema = metas[0].schema.to_arrow_schema()
        self.keys = _select(self.paths[0], schema, keys, dict(fill or {}))
        self._columns = {c.name: c for key in self.keys.values() for c in key.columns}
        for path, meta in zip(self.paths[1:], metas[1:]):
            _check_schema(path, meta.schema.to_arrow_schema(), self._columns, self.paths[0])
        # row group g holds rows [starts[g], starts[g + 1]); it is row group groups[g] = (file, number)
        self._groups = [(f, r) for f, meta in enumerate(metas) for r in range(meta.num_row_groups)]
        counts = [metas[f].row_group(r).num_rows for f, r in self._groups]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self._file_starts = np.concatenate([[0], np.cumsum([m.num_rows for m in metas])]).tolist()  # row of each file
        self._handles = LazyHandles(_open_parquet)
        self._cache = _RowGroups(int(cache_bytes))
        if not all(key.stacks for key in self.keys.values()):
            # a list column has no stacked batch: the engine reads samples (read_many); setattr: an
            # instance attribute hides the method
            setattr(self, "read_batch", None)  # noqa: B010 - mypy refuses assigning to a method

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _where(self, i: int) -> tuple[int, int]:
        """(global row group, row within it) of sample ``i``."""
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample id {i} out of range for ParquetSource of length {len(self)}")
        g = bisect.bisect_right(self._starts, i) - 1
        return g, i - int(self._starts[g])

    def locate(self, i: int) -> str:
        g, row = self._where(i)
        f, number = self._groups[g]
        return f"{self.paths[f]} row {int(self._starts[g]) + row - self._file_starts[f]} (row group {number})"

    def read_row_group(self, g: int) -> _Group:
        """Row group ``g`` (numbered across all files) decoded, bypassing the cache."""
        f, number = self._groups[g]
        with self._handles.use((self.paths[f], threading.get_ident())) as handle:
            try:
                table = handle.read_row_group(number, columns=list(self._columns), use_threads=False)
            except Exception as exc:  # a corrupt page, a failed read: name the file and the group
                raise DataError(
                    f"{self.paths[f]} row group {number}: cannot be read ({type(exc).__name__}: {exc})"
                ) from exc
        return _Group(table, self._columns)

    def _group(self, g: int) -> _Group:
        return self._cache.get(g, self.read_row_group)

    def __getitem__(self, i: int) -> dict:
        g, row = self._where(i)
        group = self._group(g)
        return {key: self._value(i, group, row, key, sel) for key, sel in self.keys.items()}

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        return [self[i] for i in ids]

    def read_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The rows of ``ids`` as stacked columns, one decode per row group they touch."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise IndexError(f"sample ids out of range for ParquetSource of length {len(self)}")
        groups = np.searchsorted(self._starts, ids, side="right") - 1
        parts: dict[str, list] = {key: [None] * len(ids) for key in self.keys}
        for g in np.unique(groups).tolist():
            positions = np.flatnonzero(groups == g)
            group = self._group(g)
            rows = ids[positions] - self._starts[g]
            for key, sel in self.keys.items():
                values = self._values(group, rows, key, sel, ids[positions])
                for k, position in enumerate(positions.tolist()):
                    parts[key][position] = values[k]
        return {key: np.stack(values) if values else np.empty(0) for key, values in parts.items()}

    def _values(self, group: _Group, rows: np.ndarray, key: str, sel: _Key, ids: np.ndarray) -> list:
        """A key's values at ``rows`` of one group, vectorised when no value there is null."""
        columns = [group.values[c.name] for c in sel.columns]
        nulls = [group.nulls[c.name] for c in sel.columns]
        if all(isinstance(v, np.ndarray) for v in columns) and not any(n is not None and n[rows].any() for n in nulls):
            picked = [v[rows].astype(c.dtype) for v, c in zip(columns, sel.columns)]
            return list(np.stack(picked, axis=1).astype(_common(sel)) if sel.vector else picked[0])
        return [self._value(int(i), group, int(r), key, sel) for i, r in zip(ids, rows)]

    def _value(self, i: int, group: _Group, row: int, key: str, sel: _Key):
        values = [self._cell(i, group, row, key, sel, c) for c in sel.columns]
        return np.array(values, dtype=_common(sel)) if sel.vector else values[0]

    def _cell(self, i: int, group: _Group, row: int, key: str, sel: _Key, column: _Column):
        nulls = group.nulls[column.name]
        if nulls is not None and nulls[row]:
            if sel.fill is not None:
                return sel.fill
            if column.kind == "number" and column.dtype is not None and column.dtype.kind == "f":
                return np.asarray(np.nan, dtype=column.dtype)
            raise DataError(
                f"{self.locate(i)}: column {column.name!r} ({column.type_text}) is null; pass "
                f"fill={{{key!r}: value}} for null values"
            )
        value = group.values[column.name][row]
        if column.kind in ("number", "fixed", "list"):
            return np.array(value, dtype=column.dtype)  # a fresh array the caller may keep
        return value  # str or bytes

    def fingerprint(self) -> str:
        keys = repr(
            sorted(
                (k, [c.name for c in v.columns], [c.type_text for c in v.columns], v.fill) for k, v in self.keys.items()
            )
        )
        return hashlib.sha256(f"{file_fingerprint(self.paths)}\0{keys}".encode()).hexdigest()

    def close(self) -> None:
        """Close this process's handles and drop its decoded row groups; both come back on use."""
        self._handles.close()
        self._cache.clear()

    def __repr__(self) -> str:
        keys = ", ".join(
            f"{k}={[c.name for c in v.columns] if v.vector else v.columns[0].name!r}" for k, v in self.keys.items()
        )
        return f"ParquetSource({len(self)} rows in {len(self.paths)} file(s), {len(self._groups)} row groups; {keys})"


def _common(sel: _Key) -> np.dtype:
    return np.result_type(*[c.dtype for c in sel.columns])


def _select(path: str, schema, keys: dict, fill: dict) -> dict[str, _Key]:
    names = schema.names
    if not keys:
        keys = {name: name for name in names}
    unknown = sorted(set(fill) - set(keys))
    if unknown:
        raise ValueError(f"fill names {unknown}, which are not keys; keys are {sorted(keys)}")
    out = {}
    for key, cols in keys.items():
        vector = not isinstance(cols, str)
        cols = list(cols) if vector else [cols]
        missing = [c for c in cols if c not in names]
        if missing or not cols:
            raise DataError(f"{path}: key {key!r}: expected columns {missing or cols}, the file has {names}")
        columns = tuple(column_reader(c, schema.field(c).type) for c in cols)
        if vector and any(c.kind != "number" for c in columns):
            raise DataError(
                f"{path}: key {key!r}: a list of columns stacks numbers; "
                f"{[c.name for c in columns if c.kind != 'number']} are not"
            )
        out[key] = _Key(columns, vector, _fill(key, fill.get(key), columns))
    return out


def _fill(key: str, value, columns: tuple):
    if value is None:
        return None
    kinds = {c.kind for c in columns}
    if kinds <= {"number", "fixed", "list"}:
        return np.asarray(value, dtype=np.result_type(*[c.dtype for c in columns]))
    return value


def _check_schema(path: str, schema, columns: dict[str, _Column], first: str) -> None:
    for name, column in columns.items():
        if name not in schema.names:
            raise DataError(f"{path}: expected column {name!r} (as in {first}), the file has {schema.names}")
        found = str(schema.field(name).type)
        if found != column.type_text:
            raise DataError(f"{path}: column {name!r} is {found}, expected {column.type_text} (as in {first})")


__all__ = ["ParquetSource", "parquet_files"]
