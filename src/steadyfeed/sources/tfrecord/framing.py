"""TFRecord framing (writing, reading and checking records), compression, and the cached index.

**Framing** (TensorFlow's, unchanged, so ``tf.data.TFRecordDataset`` reads our files and we
read its files): each record is ``uint64 length | uint32 masked_crc32c(length bytes) | data |
uint32 masked_crc32c(data)``, little-endian, where ``masked(c) = ((c >> 15) | (c << 17)) +
0xa282ead8 mod 2**32``. Both CRCs are verified on every read.

**Compression**: ``TFRecordOptions(compression_type="GZIP" | "ZLIB")`` compresses the whole
stream of framed records. It is detected from the file's first bytes (a valid record header,
the gzip magic, a zlib header) or given. A compressed stream has no random access (a
deflate stream can only be decoded from its start), so the first use decompresses the file
once, in a bounded-memory streaming pass, into a **decompressed copy** ``<file>.sfraw`` (beside
the file, or in ``cache_dir``), and every read is then a ``pread`` of that copy, exactly as
for an uncompressed file. Cost: one pass at zlib speed, and disk space for the uncompressed
stream (about the compressed size for JPEG records, which barely compress); none per read.
``steadyfeed pack`` re-shards such files into uncompressed shards that need no copy.

**Index**: random access needs where each record starts. One pass over the (decompressed)
stream reads only the 12-byte headers (and seeks past the data) and caches one int64 row
``(byte offset, data length)`` per record as ``<file>.sfidx.npy`` beside the file, or in
``cache_dir=`` (see :mod:`steadyfeed.sources.index_cache`: the rows follow a stamp of the
file's size and mtime_ns when indexed, ``INDEX_VERSION`` and the compression). Ahead of the
rows, three rows say what the rows describe: the size and mtime_ns of the stream read (the
file, or its decompressed copy), where its framing breaks, and where decompression broke.
An index that does not describe the file (and its copy) as they are now is rebuilt. A
declared length is checked against the bytes left in the stream before anything is read, so
a hostile length allocates nothing.

**Damage**: where the framing breaks (a file cut inside a record, a corrupt length, a
truncated or corrupt compressed stream), every record before that point is indexed and
reads as usual, as ``tf.data`` reads them; the break itself is kept (its byte offset, and
for a compressed file the compressed byte where decompression stopped) for the source to
report as one more, failing, record.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ...errors import DataError
from ...files import atomic_file
from .. import index_cache
from .optional import require

INDEX_SUFFIX = index_cache.SUFFIX
INDEX_VERSION = 3  # of the index rows' layout; part of the cache stamp

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER = struct.Struct("<QI")  # the length and its masked CRC
HEADER_BYTES = 12  # length + its CRC
FRAMING_BYTES = 16  # header + data CRC
_MASK_DELTA = 0xA282EAD8


@functools.cache
def _crc32c():
    return require("google_crc32c", "google-crc32c").value


def require_crc32c() -> None:
    """ImportError now, naming what to install, unless google-crc32c can be imported."""
    _crc32c()


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

    Uses ``os.pread``: no shared file position, so threads may share ``fd``. ``path`` names
    the stream in messages.
    """
    buf = os.pread(fd, FRAMING_BYTES + length, offset)
    data = buf[HEADER_BYTES : HEADER_BYTES + length]
    # the good record's checks in one expression (every batch reads through here); the one that
    # failed is found, and named, only for a bad record
    if (
        len(buf) == FRAMING_BYTES + length
        and _HEADER.unpack_from(buf) == (length, masked_crc(buf[:8]))
        and _CRC.unpack_from(buf, HEADER_BYTES + length)[0] == masked_crc(data)
    ):
        return data
    raise _record_error(buf, data, record_name(number, offset, path), length)


def _record_error(buf: bytes, data: bytes, where: str, length: int) -> DataError:
    """What is wrong with the record read as ``buf`` (its data ``data``, indexed with ``length`` bytes)."""
    if len(buf) != FRAMING_BYTES + length:
        return DataError(
            f"{where} is truncated: expected {FRAMING_BYTES + length} bytes, the file has "
            f"{len(buf)} there (did the file change after it was indexed?)"
        )
    if _CRC.unpack_from(buf, 8)[0] != masked_crc(buf[:8]):
        return DataError(f"CRC mismatch in the length of {where}")
    declared = _LENGTH.unpack_from(buf)[0]
    if declared != length:
        return DataError(
            f"{where} declares {declared} data bytes but its index says {length} "
            f"(did the file change after it was indexed?)"
        )
    return DataError(f"CRC mismatch in data of {where}")


def record_name(number: int, offset: int, path: str) -> str:
    return f"record {number} at byte {offset} of {path}"


def check_header(fd: int, name: str, size: int, offset: int, number: int) -> int:
    """The data length that the header of record ``number`` at ``offset`` declares, or DataError
    saying why it cannot be read (the one place a header is judged: scanning, and reporting a
    break later). ``name`` names the stream, ``size`` is its length."""
    record = f"record {number} at byte {offset}"
    header = os.pread(fd, HEADER_BYTES, offset)
    if len(header) < HEADER_BYTES:
        raise DataError(
            f"{name} is truncated: it ends inside the header of {record} ({len(header)} of {HEADER_BYTES} bytes)"
        )
    if _CRC.unpack_from(header, 8)[0] != masked_crc(header[:8]):
        raise DataError(
            f"CRC mismatch in the length of {record} of {name}: {_not_framed(header) if offset == 0 else 'damaged'}"
        )
    length = _LENGTH.unpack_from(header)[0]
    left = size - offset - FRAMING_BYTES
    if length > left:
        raise DataError(
            f"{name} is truncated or damaged: {record} declares {length} data bytes but only {max(left, 0)} remain"
        )
    return length


def scan_records(fd: int, name: str, size: int) -> tuple[np.ndarray, int | None]:
    """Rows ``(offset, length)`` of the records before the framing breaks, and the byte where it
    breaks (None: every byte is in a record), from one pass over the 12-byte headers."""
    rows: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            length = check_header(fd, name, size, offset, len(rows))
        except DataError:
            return _as_rows(rows), offset
        rows.append((offset, length))
        offset += FRAMING_BYTES + length
    return _as_rows(rows), None


def _as_rows(rows: list) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def scan(path: str) -> np.ndarray:
    """Index rows ``(offset, length)`` of every record of an uncompressed file, from one pass over
    the 12-byte headers. Raises DataError naming the record and byte where the framing breaks
    (truncation, a corrupt length, a length longer than what is left of the file)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        rows, broken = scan_records(f.fileno(), path, size)
        if broken is not None:
            check_header(f.fileno(), path, size, broken, len(rows))  # raises, saying why
    return rows


def _not_framed(head: bytes) -> str:
    """Why a stream's first record header does not check out: a compressed file, or not TFRecord."""
    kind = sniff_compression(head)
    if kind is None:
        return "not a TFRecord file, or damaged"
    return (
        f"it is {kind}-compressed (TFRecordOptions(compression_type={kind!r})); read it with "
        f"compression={kind!r} or compression=None (detected)"
    )


# -- compression ----------------------------------------------------------------------------------
COMPRESSIONS = ("", "GZIP", "ZLIB")  # TensorFlow's compression_type names ("" is none)
_WBITS = {"GZIP": 16 + zlib.MAX_WBITS, "ZLIB": zlib.MAX_WBITS}
RAW_SUFFIX = ".sfraw"  # a compressed file's decompressed copy, cached like its index
_READ_BYTES = 1 << 20  # compressed bytes read at a time
_OUT_BYTES = 16 << 20  # decompressed bytes produced at a time: bounds memory whatever the ratio
STREAM_PROBLEMS = {  # code -> what happened to a compressed stream (kept in the index as the code)
    1: "ends before its end marker (the file is truncated)",
    2: "is corrupt (zlib could not decode it)",
    3: "is followed by bytes that are not another compressed member",
}
_TRUNCATED, _CORRUPT, _TRAILING = 1, 2, 3


def compression_name(value) -> str | None:
    """A user's ``compression`` as one of ``COMPRESSIONS``, or None for "detect it"."""
    if value is None or (isinstance(value, str) and value.lower() == "auto"):
        return None
    name = str(value).upper()
    name = "" if name == "NONE" else name
    if name not in COMPRESSIONS:
        raise ValueError(
            f"compression must be None (detect), 'NONE' / '', 'GZIP' or 'ZLIB' (TensorFlow's "
            f"compression_type), got {value!r}"
        )
    return name


def sniff_compression(head: bytes) -> str | None:
    """ "GZIP" or "ZLIB" when ``head`` starts the way such a stream starts, else None."""
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
        return "ZLIB"  # RFC 1950: deflate, a window of at most 32 KiB, a header checksum
    return None


def detect_compression(path: str) -> str:
    """The compression of a TFRecord file: none when its first record header checks out (or it
    is empty), else what its first bytes say (a damaged uncompressed file stays uncompressed)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or _CRC.unpack_from(head, 8)[0] == masked_crc(head[:8]):
        return ""
    return sniff_compression(head) or ""


def decompress(path: str, compression: str, out) -> tuple[int, int] | None:
    """Write the decompressed stream of ``path`` to the binary file ``out``, in bounded memory;
    ``(problem code, compressed byte)`` where it stopped early (see ``STREAM_PROBLEMS``), or
    None when the whole stream decoded. What decoded before a problem is written. A GZIP file
    may hold several members, one after another (as ``cat a.gz b.gz`` makes)."""
    fresh = functools.partial(zlib.decompressobj, _WBITS[compression])
    decoder, ended, fed = fresh(), False, 0  # fed: compressed bytes consumed so far
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            data = chunk
            while data:
                if ended:  # another member may follow the end of one
                    if compression != "GZIP" or not data.startswith(b"\x1f\x8b"):
                        return _TRAILING, fed
                    decoder, ended = fresh(), False
                try:
                    out.write(decoder.decompress(data, _OUT_BYTES))
                except zlib.error:
                    return _CORRUPT, fed
                rest = decoder.unused_data if decoder.eof else decoder.unconsumed_tail
                fed += len(data) - len(rest)
                data, ended = rest, decoder.eof
    if not ended:
        try:
            out.write(decoder.flush())
        except zlib.error:
            return _CORRUPT, fed
        if not decoder.eof:
            return _TRUNCATED, fed
    return None


# -- offset index ---------------------------------------------------------------------------------
index_path = index_cache.cache_path  # where the index of a file is cached: beside it, or in cache_dir
_HEAD_ROWS = 3  # ahead of the records: (stream size, mtime_ns), (framing break or -1, 0), (problem, byte)


@dataclass(frozen=True)
class FileIndex:
    """Where the records of one file are: ``rows`` ``(offset, length)`` of ``data_path`` (the file
    itself, or its decompressed copy), and the damage found after the last good record."""

    path: str  # the user's file
    data_path: str  # the stream the rows point into
    compression: str
    rows: np.ndarray
    broken: int | None = None  # byte of the stream where the framing breaks
    stream: tuple[int, int] | None = None  # (problem code, compressed byte) where decompression stopped

    @property
    def damaged(self) -> bool:
        return self.broken is not None or self.stream is not None

    @property
    def name(self) -> str:
        return stream_name(self.path, self.compression)

    def damage_offset(self) -> int:
        """Where the first record that cannot be read starts, in the stream."""
        return self.broken if self.broken is not None else _end(self.rows)

    def damage_error(self, fd: int | None = None) -> DataError:
        """What is wrong after the last good record, naming the file and byte offsets (``fd``: the
        stream, open; else it is opened here)."""
        if fd is None:
            with open(self.data_path, "rb", buffering=0) as f:
                return self.damage_error(f.fileno())
        number, offset = len(self.rows), self.damage_offset()
        parts = []
        if self.broken is not None:
            try:
                check_header(fd, self.name, os.fstat(fd).st_size, offset, number)
                parts.append(f"record {number} at byte {offset} of {self.name} cannot be read")
            except DataError as exc:
                parts.append(str(exc))
        if self.stream is not None:
            code, byte = self.stream
            parts.append(
                f"the {self.compression} stream of {self.path} {STREAM_PROBLEMS[code]} near compressed "
                f"byte {byte}; nothing after byte {_end(self.rows) if self.broken is None else offset} of "
                f"its decompressed stream can be read"
            )
        before = f"the {number} record(s) before it read (as tf.data reads them)" if number else "no record before it"
        return DataError(f"{'; '.join(parts)}; {before}")


def stream_name(path: str, compression: str) -> str:
    """The stream the records of ``path`` are read from, as messages name it."""
    return path if not compression else f"the decompressed stream of {path}"


def _end(rows: np.ndarray) -> int:
    return int(rows[-1, 0] + FRAMING_BYTES + rows[-1, 1]) if len(rows) else 0


def _tiles(rows: np.ndarray, end: int) -> bool:
    """Whether the rows describe back-to-back records covering exactly bytes ``[0, end)``."""
    if len(rows) == 0:
        return end == 0
    offsets, lengths = rows[:, 0], rows[:, 1]
    ends = offsets + FRAMING_BYTES + lengths
    return bool(offsets[0] == 0 and (lengths >= 0).all() and np.array_equal(offsets[1:], ends[:-1]) and ends[-1] == end)


def _stamp(st: os.stat_result, compression: str) -> tuple:
    return index_cache.file_stamp(st, INDEX_VERSION, COMPRESSIONS.index(compression))


def _payload(data_st: os.stat_result, rows: np.ndarray, broken: int | None, stream) -> np.ndarray:
    code, byte = stream or (0, -1)
    head = [(data_st.st_size, data_st.st_mtime_ns), (-1 if broken is None else broken, 0), (code, byte)]
    return np.concatenate([np.array(head, np.int64), rows.astype(np.int64).reshape(-1, 2)])


def _load_cached(path: str, target: str, st: os.stat_result, compression: str, data_path: str) -> FileIndex | None:
    """The cached index if it exists and describes the file (and its copy) as they are now, else None."""
    a = index_cache.load(target, _stamp(st, compression))
    if a is None or a.ndim != 2 or a.shape[1] != 2 or len(a) < _HEAD_ROWS:
        return None
    (size, mtime_ns), (broken, _), (code, byte) = a[:_HEAD_ROWS].tolist()
    rows = a[_HEAD_ROWS:]
    try:
        data_st = st if not compression else os.stat(data_path)
    except OSError:  # the decompressed copy is gone
        return None
    if (
        (data_st.st_size, data_st.st_mtime_ns) != (size, mtime_ns)
        or code not in (0, *STREAM_PROBLEMS)
        or (code and not compression)
    ):
        return None
    if not _tiles(rows, broken if broken >= 0 else size) or broken >= size:
        return None
    return FileIndex(
        path, data_path, compression, rows, broken if broken >= 0 else None, (code, byte) if code else None
    )


def save_index(
    path: str, rows: np.ndarray, target: str, st: os.stat_result | None = None, *, index: FileIndex | None = None
) -> None:
    """Cache ``rows`` at ``target`` as the index of ``path`` as ``st`` describes it (default: as it
    is now), atomically: concurrent builders never see half of one. ``index``: what else to keep
    (compression, decompressed copy, damage); without it, every record of an uncompressed file.
    Raises OSError."""
    st = os.stat(path) if st is None else st
    compression = index.compression if index is not None else ""
    data_st = os.stat(index.data_path) if index is not None and compression else st
    broken, stream = (index.broken, index.stream) if index is not None else (None, None)
    index_cache.save(target, _stamp(st, compression), _payload(data_st, rows, broken, stream))


def open_index(path: str, compression: str | None = None, cache_dir: str | os.PathLike | None = None) -> FileIndex:
    """The index of one TFRecord file: from the cache when still valid, else built (a compressed
    file decompressed into its copy first) and cached. ``compression`` None: detected."""
    st = os.stat(path)  # before any pass: a change during it makes the cache stale, never wrong
    compression = detect_compression(path) if compression is None else compression
    target = index_path(path, cache_dir)
    data_path = index_cache.cache_path(path, cache_dir, RAW_SUFFIX) if compression else path
    index = _load_cached(path, target, st, compression, data_path)
    if index is not None:
        return index
    stream = _decompressed_copy(path, compression, data_path) if compression else None
    with open(data_path, "rb", buffering=0) as f:
        rows, broken = scan_records(f.fileno(), stream_name(path, compression), os.fstat(f.fileno()).st_size)
    index = FileIndex(path, data_path, compression, rows, broken, stream)
    try:
        save_index(path, rows, target, st, index=index)
    except OSError as exc:  # a read-only dataset still works, it only re-scans
        index_cache.warn_unsaved(f"could not cache the record index of {path}", target, exc, stacklevel=3)
    return index


def _decompressed_copy(path: str, compression: str, data_path: str) -> tuple[int, int] | None:
    """Decompress ``path`` into ``data_path`` (atomically); where the stream stopped early, if it did."""
    try:
        with atomic_file(data_path, fsync=False) as out:
            return decompress(path, compression, out)
    except OSError as exc:
        raise DataError(
            f"{path} is {compression}-compressed: random access reads a decompressed copy, which "
            f"could not be written at {data_path} ({exc}); pass cache_dir= a writable directory "
            f"with room for the uncompressed data, or decompress the file first"
        ) from exc


def load_index(path: str, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """Index rows of every record of ``path`` (cached, see :func:`open_index`); DataError when
    the file is damaged."""
    index = open_index(path, None, cache_dir)
    if index.damaged:
        raise index.damage_error()
    return index.rows
