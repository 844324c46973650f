"""TFRecord framing (writing, reading and checking records) and the cached offset index.

**Framing** (TensorFlow's, unchanged, so ``tf.data.TFRecordDataset`` reads our files and we
read its files): each record is ``uint64 length | uint32 masked_crc32c(length bytes) | data |
uint32 masked_crc32c(data)``, little-endian, where ``masked(c) = ((c >> 15) | (c << 17)) +
0xa282ead8 mod 2**32``. Both CRCs are verified on every read.

**Offset index**: random access needs where each record starts. One pass over a file reads
only the 12-byte headers (and seeks past the data) and caches one int64 row ``(byte offset,
data length)`` per record as ``<file>.sfidx.npy`` beside the file, or in ``cache_dir=``
(see :mod:`steadyfeed.sources.index_cache`: the rows follow a stamp of the file's size and
mtime_ns when indexed and ``INDEX_VERSION``). An index whose file size or mtime changed, or
whose rows do not tile the file exactly, is rebuilt. A declared length is checked against
the bytes left in the file before anything is read, so a hostile length allocates nothing.
"""
from __future__ import annotations

import functools
import os
import struct

import numpy as np

from ...errors import DataError
from .. import index_cache
from .optional import require

INDEX_SUFFIX = index_cache.SUFFIX
INDEX_VERSION = 2  # of the index rows' layout; part of the cache stamp

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = 12  # length + its CRC
FRAMING_BYTES = 16  # header + data CRC
_MASK_DELTA = 0xA282EAD8


@functools.lru_cache(maxsize=None)
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
                raise DataError(f"CRC mismatch in the length of {record} of {path}: "
                                f"{_compressed(header) if offset == 0 else 'damaged'}")
            length = _LENGTH.unpack_from(header)[0]
            left = size - offset - FRAMING_BYTES
            if length > left:
                raise DataError(f"{path} is truncated or damaged: {record} declares {length} data bytes "
                                f"but only {max(left, 0)} remain")
            rows.append((offset, length))
            offset += FRAMING_BYTES + length
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def _compressed(head: bytes) -> str:
    """Why a file's first record header does not check out: a compressed file, or not TFRecord."""
    zlib = head[:1] == b"\x78" and head[1] in b"\x01\x5e\x9c\xda"  # the zlib header's usual levels
    kind = "GZIP" if head[:2] == b"\x1f\x8b" else "ZLIB" if zlib else None
    if kind is None:
        return "not a TFRecord file, or damaged"
    return (f"it is {kind}-compressed (TFRecordOptions(compression_type={kind!r})); TFRecordSource reads "
            f"uncompressed TFRecord files, for random access: decompress it first (e.g. "
            f"{'gunzip' if kind == 'GZIP' else 'zlib.decompress'}), or write it with compression_type=''")


# -- offset index ---------------------------------------------------------------------------------
index_path = index_cache.cache_path  # where the index of a file is cached: beside it, or in cache_dir


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
    rows = index_cache.load(target, index_cache.file_stamp(st, INDEX_VERSION))
    if rows is None or rows.ndim != 2 or rows.shape[1] != 2 or not _tiles(rows, st.st_size):
        return None
    return rows


def save_index(path: str, rows: np.ndarray, target: str, st: os.stat_result | None = None) -> None:
    """Cache ``rows`` at ``target`` as the index of ``path`` as ``st`` describes it (default: as it
    is now), atomically: concurrent builders never see half of one. Raises OSError."""
    st = os.stat(path) if st is None else st
    index_cache.save(target, index_cache.file_stamp(st, INDEX_VERSION), rows)


def load_index(path: str, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """Index rows of ``path``: from the cache when still valid, else scanned and cached."""
    st = os.stat(path)  # before the scan: a change during it makes the cache stale, never wrong
    target = index_path(path, cache_dir)
    rows = _load_cached(target, st)
    if rows is None:
        rows = scan(path)
        try:
            save_index(path, rows, target, st)
        except OSError as exc:  # a read-only dataset still works, it only re-scans
            index_cache.warn_unsaved(f"could not cache the record index of {path}", target, exc, stacklevel=3)
    return rows
