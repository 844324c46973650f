"""Decoded images kept beside a pack of encoded ones (``Loader(pack_decoded=share)``).

Where decoding bounds an epoch (few cores, a fast disk), reading an image's pixels beats
decoding its JPEG: one ``preadv`` straight into the image's row of the batch, the GIL
released, against tens of microseconds of libjpeg-turbo. (Pixels inside the TFRecords were
tried first: a 48 KB record read, unframed and parsed cost about 50 us under the GIL, as much
as a decode.) The price is disk: 48 KB for a 128 x 128 RGB image held decoded, against its
7 KB JPEG. On this project's 2-core VM (``bench_pack_to.py``, ``docs/benchmarks.md``) a later
epoch from a cold page cache took 0.22-0.30 s with every image held decoded, 0.36-0.39 s from
a pack of the JPEGs alone and about 0.6 s from the files; with half held decoded it took as
long as the JPEGs alone from a cold cache (a shuffled epoch waits for the disk's read of the
pack, then decodes), and about 0.7x as long from a warm one.

Three files in the pack directory, beside its shards (which stay as they were, every image's
bytes, so other tools read the pack as before):

* ``decoded.pixels``: the pixels of the chosen images, one after the other, as
  ``ImageFolder.decode`` gives them (uint8, C order);
* ``decoded.npy``: one row per image id (a structured array, no pickle): ``offset`` in the
  pixels file (-1: not held), ``shape`` (height, width, channels) and ``crc``, TFRecord's
  masked CRC32C of the pixels, checked on every read as a record's is;
* ``decoded.json``: the format's version and the decoding settings the pixels were made with
  (``ImageReader.decoding``: size, channels, DCT, limits); a folder with other settings is
  refused, naming both, rather than given pixels it would not decode.

Guarantees: the pixels read are those written, bit for bit, or :class:`DataError` names the
file and the image (a CRC mismatch, a short read); an image that failed to decode when the
pack was made is not held, so reading it decodes its bytes and fails, named, as the folder
does. Pickles as its paths, so process workers open their own handle.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..files import atomic_file, atomic_write
from .base import LazyHandles
from .tfrecord.framing import masked_crc

PIXELS_NAME, INDEX_NAME, ABOUT_NAME = "decoded.pixels", "decoded.npy", "decoded.json"
FORMAT = "steadyfeed.decoded/1"
INDEX_DTYPE = np.dtype([("offset", "<i8"), ("shape", "<u4", (3,)), ("crc", "<u4")])


def stores_decoded(i: int, share: float) -> bool:
    """Whether image ``i`` is among a ``share`` of the ids spread evenly (about ``share`` of
    any run of ids, so of any shuffled batch, is held decoded)."""
    return math.floor((i + 1) * share) > math.floor(i * share)


def write_decoded(
    count: int,
    share: float,
    decode: Callable[[int], np.ndarray | None],
    directory: Path,
    decoding: dict,
    check: Callable[[], None],
) -> None:
    """Write the three files into ``directory`` for ``count`` images, ``share`` of them decoded
    by ``decode(i)`` (None: not decodable, so not held) with the settings ``decoding``, in id
    order; each file flushed to disk. ``check()`` is called between images, and stops the
    writing by raising (a closed loader)."""
    index = np.zeros(count, INDEX_DTYPE)
    index["offset"] = -1
    offset = 0
    with atomic_file(directory / PIXELS_NAME) as out:  # fsynced; a full disk raises DiskFull
        for i in range(count):
            if not stores_decoded(i, share):
                continue
            check()
            image = decode(i)
            if image is None:
                continue
            image = np.ascontiguousarray(image, np.uint8)
            out.write(image.data)
            index[i] = (offset, image.shape, _crc(image))
            offset += image.nbytes
    table = io.BytesIO()
    np.save(table, index, allow_pickle=False)
    atomic_write(directory / INDEX_NAME, table.getvalue())
    atomic_write(directory / ABOUT_NAME, json.dumps({"format": FORMAT, "share": share, "decoding": decoding}).encode())


def _crc(image: np.ndarray) -> int:
    # google-crc32c takes bytes only; a 48 KB copy costs less than zlib.crc32 reading the array in place
    return masked_crc(image.tobytes())


def _check_about(path: Path, decoding: dict) -> None:
    """DataError unless ``path`` says this format, made with the settings ``decoding``."""
    try:
        with open(path, encoding="utf-8") as f:
            about = json.load(f)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc}); expected what pack wrote beside its shards") from None
    if not isinstance(about, dict) or about.get("format") != FORMAT:
        found = about.get("format") if isinstance(about, dict) else about
        raise DataError(
            f"{path}: format {found!r}, this steadyfeed reads {FORMAT!r}; remove the pack to build it again"
        )
    if about.get("decoding") != decoding:
        raise DataError(
            f"{path}: its images were decoded with {about.get('decoding')}, the folder reading them decodes with "
            f"{decoding}; read the pack with the settings it was made with"
        )


def _fits(into: np.ndarray | None, shape: tuple) -> bool:
    """Whether pixels of ``shape`` can be read straight into ``into`` (a batch's row)."""
    return into is not None and into.shape == shape and into.dtype == np.uint8 and into.flags.c_contiguous


def _open_readonly(path: str) -> int:
    return os.open(path, os.O_RDONLY)


class DecodedPixels:
    """The decoded images held in ``directory`` (written by :func:`write_decoded`)."""

    def __init__(self, directory: str | os.PathLike[str], count: int, decoding: dict):
        self.directory = Path(directory)
        _check_about(self.directory / ABOUT_NAME, decoding)
        self.decoding = decoding
        self.index = np.load(self.directory / INDEX_NAME, allow_pickle=False)  # 24 bytes an image, in memory
        if self.index.dtype != INDEX_DTYPE or self.index.shape != (count,):
            raise DataError(
                f"{self.directory / INDEX_NAME} describes {self.index.shape} images of {self.index.dtype}; "
                f"expected ({count},) of {INDEX_DTYPE} (the pack of this very source)"
            )
        self.path = str(self.directory / PIXELS_NAME)
        self._handles = LazyHandles(_open_readonly, os.close)

    @classmethod
    def beside(cls, records: Any, folder: Any) -> DecodedPixels | None:
        """The images of ``folder`` held decoded in the directory of its pack's shards (``records``),
        if it holds any."""
        folders = {os.path.dirname(p) for p in getattr(records, "paths", ())}
        if len(folders) != 1:
            return None
        directory = Path(folders.pop())
        return cls(directory, len(folder), folder.decoding) if (directory / ABOUT_NAME).exists() else None

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Per id, whether its pixels are held."""
        return self.index["offset"][ids] >= 0

    def read(self, i: int, into: np.ndarray | None = None) -> np.ndarray:
        """Image ``i``'s pixels (held: see ``holds``) in a new array, or straight into ``into``
        when it is a C-contiguous uint8 array of their shape (and then returned)."""
        with self.reading(np.asarray([i])) as read:
            return read(i, into)

    @contextlib.contextmanager
    def reading(self, ids: np.ndarray) -> Iterator[Callable[..., np.ndarray]]:
        """``read(i, into=None)`` for the held images among ``ids`` (a batch), through one handle."""
        rows = self.index[ids]
        where = {
            int(i): (int(row["offset"]), tuple(row["shape"].tolist()), int(row["crc"])) for i, row in zip(ids, rows)
        }
        with self._handles.use(self.path) as fd:

            def read(i: int, into: np.ndarray | None = None) -> np.ndarray:
                offset, shape, crc = where[i]
                out = into if _fits(into, shape) else np.empty(shape, np.uint8)
                assert out is not None
                got = os.preadv(fd, [out.data], offset)
                if got != out.nbytes or _crc(out) != crc:
                    raise self._damaged(i, offset, out.nbytes, got)
                return out

            yield read

    def _damaged(self, i: int, offset: int, size: int, got: int) -> DataError:
        problem = f"only {got} bytes there" if got != size else "CRC mismatch"
        return DataError(
            f"{self.path}: the decoded pixels of image {i} ({size} bytes at {offset}): {problem}; "
            f"the pack is damaged (remove it: pack_to builds it again)"
        )

    def close(self) -> None:
        self._handles.close()

    def __reduce__(self):  # its paths, not its index: a worker loads the index itself
        return DecodedPixels, (self.directory, len(self.index), self.decoding)
