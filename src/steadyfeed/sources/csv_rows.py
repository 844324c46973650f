"""CsvSource: random access to the rows of a CSV file through a cached row-offset index.

One streaming pass finds the byte offset where every data row starts, by the csv
module's own rules (quoted fields may hold delimiters, quotes and line breaks). The
index is saved next to the file (``<file>.sfidx.npy``) or in ``cache_dir``, stamped with
the file's size, modification time and the parsing options, and rebuilt whenever any
of them differ. Reading row ``i`` then reads only the bytes of that row (``os.pread``)
and parses them with ``csv.reader``.

Keys are named after the keyword arguments that select them::

    CsvSource("train.csv", x=["a", "b", "c"], y="label", dtypes={"y": "int64"})
    # sample i: {"x": float32 array of shape (3,), "y": int64 scalar}
    CsvSource("pets.csv", x=["w", "h"], y="species", dtypes={"y": "class"})
    # "y": the int64 class id of the species name; source.classes: the names, sorted

Files as ``pandas.DataFrame.to_csv`` writes them read as pandas reads them: a missing value
(an empty field, or one of pandas' default NA strings, ``NA_VALUES``: "NA", "NaN", "null",
"N/A", ...) is NaN in a float key; in an integer or class key it is an error naming the row
and column unless ``fill={key: value}`` gives its value (``fill`` also replaces the NaN of a
float key); an integer written as a float ("3.0", as pandas writes an int column holding
NaN) reads as that integer, a fraction does not. A class key (dtype "class", or "str")
reads text labels as int64 ids: the distinct names of its columns (missing values aside),
sorted, are ids 0, 1, ... (``classes``, ``class_to_label``, as :class:`ImageFolder`), found
in one pass over the file when the source is made.

Guarantees:

* every non-blank record after the header is one row; blank lines are not rows (as in
  ``csv.DictReader``); a header-only file has ``len == 0``; an empty file with
  ``header=True`` is a :class:`DataError`;
* a row whose field count differs from the header's, or a value that does not parse as
  its key's dtype (or overflows it), raises :class:`DataError` naming the file, the
  1-based line where the row starts, the column and what was expected;
* no row longer than ``max_row_bytes`` is ever read into memory, including the runaway
  "row" an unclosed quote makes, which is refused at indexing time;
* the file is checked against the index whenever a process opens it: a changed file is
  a :class:`DataError`, never a silently misaligned row.

Rows must end with LF or CRLF; the encoding must be ASCII-compatible (UTF-8, "utf-8-sig",
Latin-1, cp1252). A UTF-8 byte-order mark is skipped. The csv module's per-field limit
(``csv.field_size_limit()``, 131072 characters by default) applies.
"""

from __future__ import annotations

import bisect
import codecs
import csv
import hashlib
import io
import os
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import DataError
from . import index_cache
from .base import LazyHandles, file_fingerprint
from .index_cache import SUFFIX  # noqa: F401 - part of this module's interface (where the index is cached)

FORMAT_VERSION = 2  # of the cached index's payload (see _Index.save)
_HEAD = 3  # payload words ahead of the offsets: rows, line0, has lines
_CHUNK = 1 << 24  # bytes per numpy pass of the quote-free scan: bounds its temporary memory
_BOM = codecs.BOM_UTF8
_MAX_SHOWN = 40  # characters of a bad value quoted in an error message
# pandas.read_csv's default missing-value strings (its documented na_values defaults)
NA_VALUES = frozenset(
    {
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    }
)
CLASS_DTYPES = ("class", "str")  # a key of text labels, read as int64 class ids
_CLASS_ROWS_PER_READ = 4096


@dataclass(frozen=True)
class _Dialect:
    """How the file is parsed; every field takes part in the index's cache stamp (via digest)."""

    delimiter: str
    quotechar: str | None
    escapechar: str | None
    encoding: str
    header: bool
    max_row_bytes: int

    def __post_init__(self):
        for name in ("delimiter", "quotechar", "escapechar"):
            char = getattr(self, name)
            optional = name != "delimiter"
            if (char is None and not optional) or (
                char is not None and (len(char) != 1 or not char.isascii() or char in "\r\n")
            ):
                raise ValueError(
                    f"{name} must be one ASCII character other than CR/LF{' or None' if optional else ''}, got {char!r}"
                )
        if _without_bom("a,b".encode(self.encoding)) != b"a,b":  # the newline search needs ASCII-compatible bytes
            raise ValueError(f"encoding must be ASCII-compatible (e.g. utf-8, latin-1), got {self.encoding!r}")
        if int(self.max_row_bytes) < 1:
            raise ValueError(f"max_row_bytes must be >= 1, got {self.max_row_bytes!r}")

    def reader(self, lines):
        quoting = csv.QUOTE_MINIMAL if self.quotechar else csv.QUOTE_NONE
        return csv.reader(
            lines, delimiter=self.delimiter, quotechar=self.quotechar, escapechar=self.escapechar, quoting=quoting
        )

    def quoting_bytes(self) -> list[int]:
        """Bytes that can hide a row boundary from a plain newline search (besides a lone CR)."""
        return [ord(c) for c in (self.quotechar, self.escapechar) if c]

    def digest(self) -> int:
        text = repr(
            (
                self.delimiter,
                self.quotechar,
                self.escapechar,
                codecs.lookup(self.encoding).name,
                self.header,
                self.max_row_bytes,
            )
        )
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def _without_bom(data: bytes) -> bytes:
    """``data`` less a leading UTF-8 byte-order mark (what encoding "utf-8-sig" writes first)."""
    return data[len(_BOM) :] if data.startswith(_BOM) else data


# -- indexing ----------------------------------------------------------------------------------


class _Records:
    """The records of a binary file from byte ``pos`` on, by ``csv.reader`` rules, each with
    the byte offset and 1-based line where it starts. Reads physical lines of at most
    ``max_row_bytes``, so an unterminated line or an unclosed quote never fills memory."""

    def __init__(self, f, path: str, dialect: _Dialect, pos: int, line: int):
        self.f, self.path, self.dialect = f, path, dialect
        self.pos, self.line = pos, line  # where the next unread physical line starts
        self.start, self.start_line = pos, line  # where the current record starts

    def _lines(self):
        cap = self.dialect.max_row_bytes
        while raw := self.f.readline(cap + 1):
            self.pos += len(raw)
            self.line += 1
            if self.pos - self.start > cap:
                raise DataError(
                    f"{self.path}:{self.start_line}: expected rows of at most max_row_bytes={cap} "
                    f"bytes, found a longer one (an unclosed quote?)"
                )
            yield raw.decode(self.dialect.encoding)

    def __iter__(self):
        try:
            for fields in self.dialect.reader(self._lines()):  # csv.reader never reads past a record
                yield fields, self.start, self.start_line
                self.start, self.start_line = self.pos, self.line
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{self.path}:{self.line - 1}: expected {self.dialect.encoding} CSV: {exc}") from exc


def _scan_records(path: str, dialect: _Dialect, start: int, line: int) -> tuple[np.ndarray, np.ndarray]:
    """Row starts (plus the end of the data) and row lines, record by record: exact for any CSV."""
    starts, lines = array("q"), array("q")
    with open(path, "rb") as f:
        f.seek(start)
        records = _Records(f, path, dialect, start, line)
        for fields, at, at_line in records:
            if fields:  # a blank line is no row
                starts.append(at)
                lines.append(at_line)
        starts.append(records.pos)
    return np.frombuffer(starts, np.int64).copy(), np.frombuffer(lines, np.int64).copy()


def _scan_newlines(path: str, dialect: _Dialect, start: int, line: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The same as :func:`_scan_records`, found with numpy, for data without quotes, escapes or
    lone CRs (then every LF ends a row and the csv module's rules reduce to that); None when
    such a byte appears."""
    data = np.memmap(path, np.uint8, mode="r")
    size, newlines = len(data), []
    for lo in range(start, size, _CHUNK):
        chunk = data[lo : lo + _CHUNK]
        crs = np.flatnonzero(chunk == 13) + lo
        lone_cr = crs.size and (crs[-1] + 1 == size or (data[crs + 1] != 10).any())
        if lone_cr or any((chunk == b).any() for b in dialect.quoting_bytes()):
            return None
        newlines.append(np.flatnonzero(chunk == 10) + lo)
    ends = np.concatenate(newlines) + 1
    if ends.size == 0 or ends[-1] != size:  # a last line without a line break
        ends = np.append(ends, size)
    starts = np.concatenate(([start], ends[:-1])).astype(np.int64)
    length, first = ends - starts, data[starts]
    rows = np.flatnonzero(~(((length == 1) & (first == 10)) | ((length == 2) & (first == 13))))  # not "\n", "\r\n"
    return np.append(starts[rows], size), line + rows


@dataclass
class _Index:
    """Row ``i`` is the bytes ``[offsets[i], offsets[i + 1])`` (with any blank lines after it) and
    starts on line ``lines[i]``; ``lines`` is None when that is simply ``line0 + i``."""

    offsets: np.ndarray
    lines: np.ndarray | None
    line0: int

    @classmethod
    def build(cls, path: str, dialect: _Dialect, start: int, line: int) -> _Index:
        if start == os.path.getsize(path):  # nothing after the header (numpy cannot map an empty file)
            offsets, lines = np.array([start], np.int64), np.empty(0, np.int64)
        else:
            offsets, lines = _scan_newlines(path, dialect, start, line) or _scan_records(path, dialect, start, line)
        spans = np.diff(offsets)
        if spans.size and spans.max() > dialect.max_row_bytes:
            bad = int(spans.argmax())
            raise DataError(
                f"{path}:{lines[bad]}: expected rows of at most max_row_bytes={dialect.max_row_bytes} "
                f"bytes, found one of {spans[bad]} (with any blank lines after it)"
            )
        line0 = int(lines[0]) if lines.size else line
        plain = np.array_equal(lines, line0 + np.arange(lines.size))
        return cls(offsets, None if plain else lines, line0)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def line(self, i: int) -> int:
        return int(self.lines[i]) if self.lines is not None else self.line0 + i

    def save(self, cache: str, stamp: tuple) -> None:
        """Cached (atomically) as the payload ``rows, line0, has lines | offsets | lines if any``."""
        head = np.array([len(self), self.line0, int(self.lines is not None)], np.int64)
        lines = [self.lines] if self.lines is not None else []
        index_cache.save(cache, stamp, np.concatenate([head, self.offsets, *lines]))

    @classmethod
    def load(cls, cache: str, stamp: tuple, start: int, end: int) -> _Index | None:
        """The cached index (memory-mapped) when its stamp and shape check out and its rows lie
        between the data ``start`` and the file's ``end``, else None."""
        a = index_cache.load(cache, stamp, mmap=True)
        if a is None or a.ndim != 1 or len(a) < _HEAD:
            return None
        rows, line0, has_lines = (int(v) for v in a[:_HEAD])
        if rows < 0 or has_lines not in (0, 1) or len(a) != _HEAD + rows + 1 + rows * has_lines:
            return None
        offsets = a[_HEAD : _HEAD + rows + 1]
        if offsets[0] < start or offsets[-1] != end:
            return None
        return cls(offsets, a[_HEAD + rows + 1 :] if has_lines else None, line0)


def _read_header(path: str, dialect: _Dialect) -> tuple[list[str] | None, int, int, int]:
    """(column names or None, byte and line where data starts, fields per row)."""
    with open(path, "rb") as f:
        utf8 = codecs.lookup(dialect.encoding).name.startswith("utf-8")
        start = len(_BOM) if utf8 and f.read(len(_BOM)) == _BOM else 0
        f.seek(start)
        records = _Records(f, path, dialect, start, 1)
        first = next((fields for fields, _, _ in records if fields), None)
        if not dialect.header:
            return None, start, 1, len(first or ())
        if first is None:
            raise DataError(
                f"{path}: expected a header line naming the columns, found "
                f"{'an empty file' if records.pos == start else 'only blank lines'}"
            )
        return first, records.pos, records.line, len(first)


# -- selection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    """One key of a sample: the fields it reads, their names, its dtype, vector or scalar; a
    class key's names (``classes``: its dtype is int64); the value of a missing field, if any."""

    fields: tuple
    names: tuple
    dtype: np.dtype
    vector: bool
    labels: bool = False  # a class key
    classes: tuple = ()
    fill: np.ndarray | None = None  # 0-d, of dtype

    def describe(self) -> str:
        return "class names" if self.labels else str(self.dtype)


_ONE = (str, int, np.integer)  # selects one column: a scalar key


def _select(path: str, keys: dict, dtypes: dict, names: list[str] | None, nfields: int) -> dict[str, _Key]:
    if not keys:
        raise ValueError("CsvSource needs at least one key, e.g. CsvSource(path, x=['a', 'b'], y='label')")
    unknown = sorted(set(dtypes) - set(keys))
    if unknown:
        raise ValueError(f"dtypes names {unknown}, which are not keys; dtypes are per key, keys are {sorted(keys)}")
    missing = [
        c
        for cols in keys.values()
        for c in ([cols] if isinstance(cols, _ONE) else cols)
        if isinstance(c, str) and (names is None or c not in names)
    ]
    if missing:
        raise DataError(
            f"{path}: expected columns {missing} in the header, available: {names}"
            if names is not None
            else f"{path}: columns {missing} are names, which need header=True"
        )
    return {key: _key(path, key, cols, dtypes.get(key, "float32"), names, nfields) for key, cols in keys.items()}


def _key(path: str, key: str, cols, dtype, names, nfields: int) -> _Key:
    labels = isinstance(dtype, str) and dtype in CLASS_DTYPES
    dtype = np.dtype("int64" if labels else dtype)
    if dtype.kind not in "iuf":
        raise ValueError(
            f"key {key!r}: dtype must be an integer or float type, or 'class' for text labels, got {dtype}"
        )
    vector = not isinstance(cols, _ONE)
    cols = list(cols) if vector else [cols]
    if not cols:
        raise ValueError(f"key {key!r} selects no columns")
    fields = []
    for c in cols:
        if isinstance(c, str):
            if names.count(c) > 1:
                raise DataError(
                    f"{path}: column {c!r} appears {names.count(c)} times in the header; select it by position"
                )
            fields.append(names.index(c))
        elif isinstance(c, (int, np.integer)) and not isinstance(c, bool) and 0 <= c and (c < nfields or not nfields):
            fields.append(int(c))
        else:
            raise DataError(f"{path}: key {key!r}: expected a column name or a position 0..{nfields - 1}, got {c!r}")
    shown = tuple(names[f] if names else f"field {f + 1}" for f in fields)
    return _Key(tuple(fields), shown, dtype, vector, labels)


def _number(value: str) -> float | None:
    """``value`` as a float, or None when it is no number at all (text)."""
    try:
        return float(value)
    except ValueError:
        return None


# -- the source ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Opener:
    """Opens the file for ``os.pread`` and refuses one that changed since it was indexed."""

    path: str
    size: int
    mtime_ns: int

    def __call__(self, _key) -> int:
        fd = os.open(self.path, os.O_RDONLY)
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            os.close(fd)
            raise DataError(
                f"{self.path}: changed since it was indexed (expected size {self.size}, mtime_ns "
                f"{self.mtime_ns}; found {st.st_size}, {st.st_mtime_ns}); build a new CsvSource"
            )
        return fd


class CsvSource:
    """Random access to the rows of a CSV file; see the module docstring for the guarantees.

    ``CsvSource(path, *, dtypes=None, fill=None, na_values=NA_VALUES, header=True, delimiter=",",
    quotechar='"', escapechar=None, encoding="utf-8", cache_dir=None, max_row_bytes=2**20, **keys)``

    Each keyword in ``keys`` names a key of the sample; its value selects columns by
    header name or 0-based position. A list gives a vector (shape ``(k,)``), a single
    column a scalar. ``dtypes`` maps keys to integer or float dtypes (default float32), or
    "class" for text labels read as class ids. ``fill`` maps keys to the value a missing
    field takes; ``na_values`` are the strings that are missing (pandas' defaults).
    The option names above cannot be keys. ``cache_dir`` holds the index when the
    data's directory is read-only; when the index cannot be saved at all, a warning
    says so and the index travels to worker processes in the pickle.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        /,
        *,
        dtypes: Mapping[str, Any] | None = None,
        fill: Mapping[str, Any] | None = None,
        na_values: Iterable[str] = NA_VALUES,
        header: bool = True,
        delimiter: str = ",",
        quotechar: str | None = '"',
        escapechar: str | None = None,
        encoding: str = "utf-8",
        cache_dir: str | os.PathLike[str] | None = None,
        max_row_bytes: int = 1 << 20,
        **keys: str | int | Sequence[str | int],
    ) -> None:
        self.path = os.fspath(path)
        self.dialect = _Dialect(delimiter, quotechar, escapechar, encoding, bool(header), int(max_row_bytes))
        st = os.stat(self.path)
        names, start, line, self._nfields = _read_header(self.path, self.dialect)
        self._field_origin = "as in the header" if header else "as in the first row"
        self.columns = names  # the header's column names (None without a header)
        self.keys = _select(self.path, keys, dict(dtypes or {}), names, self._nfields)
        self.na_values = frozenset(na_values)
        self._stamp = index_cache.file_stamp(st, FORMAT_VERSION, self.dialect.digest(), start)
        self._span = (start, st.st_size)  # where the rows lie
        self._cache: str | None = index_cache.cache_path(self.path, cache_dir)
        index = _Index.load(self._cache, self._stamp, *self._span)  # (an index of 0 rows is falsy: compare with None)
        self._index: _Index | None = self._build(st, line) if index is None else index
        self._len = len(self._index)
        self._handles = LazyHandles(_Opener(self.path, st.st_size, st.st_mtime_ns), os.close)
        self.keys = {key: self._finish_key(key, sel, (fill or {}).get(key)) for key, sel in self.keys.items()}
        unknown = sorted(set(fill or {}) - set(self.keys))
        if unknown:
            raise ValueError(f"fill names {unknown}, which are not keys; fill is per key, keys are {sorted(self.keys)}")

    def _finish_key(self, key: str, sel: _Key, fill) -> _Key:
        """``sel`` with its class names (one pass over its columns) and its fill value, checked."""
        classes = self._class_names(sel) if sel.labels else ()
        if fill is not None:
            try:
                fill = np.array(fill, dtype=sel.dtype)
            except (ValueError, OverflowError, TypeError):
                raise ValueError(f"fill[{key!r}] = {fill!r} is not a {sel.dtype} value") from None
            if fill.ndim:
                raise ValueError(f"fill[{key!r}] must be one value, got {fill.shape}")
        return replace(sel, classes=classes, fill=fill)

    def _class_names(self, sel: _Key) -> tuple:
        names: set[str] = set()
        for start in range(0, self._len, _CLASS_ROWS_PER_READ):
            ids = range(start, min(start + _CLASS_ROWS_PER_READ, self._len))
            for i, fields in zip(ids, self.records(ids)):
                self.check_fields(i, fields)
                names.update(fields[f] for f in sel.fields)
        return tuple(sorted(names - self.na_values))

    @property
    def classes(self) -> list[str] | None:
        """The class names of the one class key (``dtypes={key: "class"}``), sorted: id ``k`` is
        ``classes[k]``; None without a class key (several: see ``key_classes``)."""
        found = self.key_classes
        return next(iter(found.values())) if len(found) == 1 else None

    @property
    def class_to_label(self) -> dict[str, int] | None:
        return None if self.classes is None else {name: k for k, name in enumerate(self.classes)}

    @property
    def key_classes(self) -> dict[str, list[str]]:
        """Every class key's names."""
        return {key: list(sel.classes) for key, sel in self.keys.items() if sel.labels}

    def _build(self, st: os.stat_result, line: int) -> _Index:
        """Index the file (as ``st`` describes it) and cache the index if it can be saved."""
        index = _Index.build(self.path, self.dialect, self._span[0], line)
        now = os.stat(self.path)
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise DataError(f"{self.path}: changed while it was being indexed; try again once it is complete")
        assert self._cache is not None  # _build runs in __init__, before the path can become None
        try:
            index.save(self._cache, self._stamp)
        except OSError as exc:
            index_cache.warn_unsaved(
                f"CsvSource could not save the index of {self.path}", self._cache, exc, stacklevel=3
            )
            self._cache = None  # the index then travels in the pickle
        return index

    def _idx(self) -> _Index:
        index = self._index
        if index is None:  # dropped by close() or pickling: reload (two threads may both; either copy is right)
            assert self._cache is not None  # only a saved index is dropped
            index = self._index = _Index.load(self._cache, self._stamp, *self._span)
            if index is None:
                raise DataError(
                    f"{self.path}: its index {self._cache} is gone or was rebuilt for a changed "
                    f"file; build a new CsvSource"
                )
        return index

    def __len__(self) -> int:
        return self._len

    def locate(self, i: int) -> str:
        return f"{self.path}:{self._idx().line(i)}"

    def __getitem__(self, i: int) -> dict:
        return self.read_many([i])[0]

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        rows = self._rows(ids)
        with np.errstate(over="raise"):  # "1e40" as float32 is an error, not inf
            return [self._sample(i, fields) for i, fields in rows]

    def fields(self, i: int) -> list[str]:
        """Row ``i`` as csv.reader gives it: every field, as text."""
        return self._rows([i])[0][1]

    def records(self, ids: Sequence[int] | np.ndarray) -> list[list[str]]:
        """``fields`` of each id (consecutive ids are read with one pread): for scanning a file."""
        return [fields for _, fields in self._rows(ids)]

    def check_fields(self, i: int, fields: list[str]) -> None:
        """DataError naming the line unless row ``i`` has as many fields as the header (or first row)."""
        if len(fields) != self._nfields:
            raise DataError(
                f"{self.locate(i)}: expected {self._nfields} fields ({self._field_origin}), found {len(fields)}"
            )

    def _rows(self, ids) -> list[tuple[int, list[str]]]:
        """(id, fields) per id; consecutive ids are read with one pread."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._len]
        if bad:
            raise IndexError(f"sample id {bad[0]} out of range for {self!r} of length {self._len}")
        if not ids:
            return []
        offsets = self._idx().offsets
        if ids == list(range(ids[0], ids[0] + len(ids))):
            bounds = np.asarray(offsets[ids[0] : ids[-1] + 2])
            blob, base = self._pread(ids[0], int(bounds[0]), int(bounds[-1]), len(ids)), int(bounds[0])
            spans = zip(ids, bounds[:-1].tolist(), bounds[1:].tolist())
            return [(i, self._parse(i, blob[s - base : e - base])) for i, s, e in spans]
        return [(i, self._parse(i, self._pread(i, int(offsets[i]), int(offsets[i + 1]), 1))) for i in ids]

    def _pread(self, i: int, start: int, end: int, rows: int) -> bytes:
        if not 0 < end - start <= rows * self.dialect.max_row_bytes:  # never trust a span blindly
            raise DataError(
                f"{self.locate(i)}: the index gives a span of {end - start} bytes for {rows} row(s), "
                f"expected 1..{rows} x max_row_bytes; the index file {self._cache} is corrupt"
            )
        with self._handles.use() as fd:
            data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise DataError(
                f"{self.locate(i)}: expected {end - start} bytes at offset {start}, found {len(data)}; "
                f"the file is shorter than its index"
            )
        return data

    def _parse(self, i: int, raw: bytes) -> list[str]:
        try:
            records = [r for r in self.dialect.reader(io.StringIO(raw.decode(self.dialect.encoding), newline="")) if r]
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{self.locate(i)}: expected {self.dialect.encoding} CSV: {exc}") from exc
        if len(records) != 1:
            raise DataError(
                f"{self.locate(i)}: expected one row, found {len(records)}; the file changed since it was indexed"
            )
        return records[0]

    def _sample(self, i: int, fields: list[str]) -> dict:
        self.check_fields(i, fields)
        return {key: self._value(i, fields, key, sel) for key, sel in self.keys.items()}

    def _value(self, i: int, fields: list[str], key: str, sel: _Key) -> np.ndarray:
        values = [fields[f] for f in sel.fields]
        try:
            if sel.labels:
                raise ValueError  # names, never numbers: the per-value path maps them
            out = np.array(values, dtype=sel.dtype)  # the fast path: every value a plain number
        except (ValueError, OverflowError, FloatingPointError):
            out = np.array(
                [self._one(i, value, name, key, sel) for value, name in zip(values, sel.names)], dtype=sel.dtype
            )
        else:
            if sel.fill is not None and sel.dtype.kind == "f":  # "nan" parsed as NaN: missing too
                out[np.isnan(out)] = sel.fill
        return out if sel.vector else out.reshape(())

    def _one(self, i: int, value: str, name: str, key: str, sel: _Key):
        """One field as ``sel`` reads it: a missing value, a class name, a number; else DataError."""
        shown = value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "..."
        if value in self.na_values:
            if sel.fill is not None:
                return sel.fill
            if sel.dtype.kind == "f":
                return np.nan
            raise self._bad(
                i,
                name,
                f"missing value {shown!r}: {sel.describe()} has no NaN; pass "
                f"fill={{{key!r}: value}} for missing values" + ("" if sel.labels else ", or read it as float32 (NaN)"),
            )
        if sel.labels:
            at = bisect.bisect_left(sel.classes, value)
            if at == len(sel.classes) or sel.classes[at] != value:
                raise self._bad(
                    i,
                    name,
                    f"{shown!r} is not one of the class names found when the source was made (did the file change?)",
                )
            return at
        try:
            return np.array([value], dtype=sel.dtype)[0]
        except (ValueError, OverflowError, FloatingPointError) as exc:
            number = _number(value)
            if number is None:
                raise self._bad(
                    i,
                    name,
                    f"expected {sel.dtype}, found {shown!r}; text labels read as class ids "
                    f"with dtypes={{{key!r}: 'class'}}",
                ) from None
            if type(exc) is not ValueError or not (sel.dtype.kind in "iu" and number.is_integer()):
                why = " (out of range)" if type(exc) is not ValueError else ""
                raise self._bad(i, name, f"expected {sel.dtype}, found {shown!r}{why}") from None
        # an integer written as a float ("3.0": how pandas writes an int column that holds NaN)
        info = np.iinfo(sel.dtype)
        if not info.min <= number <= info.max:
            raise self._bad(i, name, f"expected {sel.dtype}, found {shown!r} (out of range)")
        return int(number)

    def _bad(self, i: int, name: str, message: str) -> DataError:
        return DataError(f"{self.locate(i)}: column {name!r}: {message}")

    def fingerprint(self) -> str:
        selection = repr(
            (
                self.dialect,
                sorted(self.na_values),
                sorted(
                    (k, v.fields, v.dtype.str, v.vector, v.classes, None if v.fill is None else v.fill.item())
                    for k, v in self.keys.items()
                ),
            )
        )
        return hashlib.sha256((file_fingerprint([self.path]) + selection).encode()).hexdigest()

    def close(self) -> None:
        """Close this process's file handle and drop a memory-mapped index; both reopen on use."""
        self._handles.close()
        if self._cache is not None:
            self._index = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._cache is not None:  # workers map the saved index rather than receive a copy
            state["_index"] = None
        return state

    def __repr__(self) -> str:
        keys = ", ".join(
            f"{k}={list(v.names) if v.vector else v.names[0]!r}:{v.describe()}" for k, v in self.keys.items()
        )
        return f"CsvSource({self.path!r}, {keys}, rows={self._len})"
