"""An ImageFolder packed as its files' bytes: what ``Loader(pack_to=...)`` stores for images.

A pack of decoded pixels is 5-10x the size of the JPEGs it came from, so reading it back is
bound by the disk (``docs/benchmarks.md``, ``bench_pack_to.py``). A pack of the files' bytes
is as small as the files, read in large sequential reads, and decoded as the folder decodes:

* ``EncodedImages(folder)[i]`` is ``{"x": the bytes of file i, "y": its label}``: what is
  packed. A file that cannot be read (or is over ``max_bytes``) fails here, as it does in
  the folder; an empty or corrupt one is packed as it is and fails when it is decoded;
* ``PackedImages(folder, records)[i]`` (``records`` a TFRecordSource of those samples) equals
  ``folder[i]`` bit for bit: the same bytes through the same decoder and settings
  (``size``, ``channels``, ``fast``, the refusals). An image that fails to decode raises
  DataError naming its original file; ``read_batch`` decodes into one array as
  ``ImageFolder.read_batch`` does.

**Held decoded** (``EncodedImages(folder, decoded=share)``, ``Loader(pack_decoded=share)``):
the pack also holds the decoded pixels of that share of the images, spread evenly over the
ids, beside its shards (``decoded_pixels.py``: what it costs and gains), and ``PackedImages``
reads those instead of decoding them. The shards are the same as without, so other tools
read the pack as before.

Both pickle as the folder's paths and settings, so process workers read them too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .base import Allocator, close_source
from .decoded_pixels import DecodedPixels, write_decoded
from .images import ImageFolder, _read, decode_columns


class EncodedImages:
    """``folder``'s samples as packed: each file's bytes (``"x"``) and label (``"y"``); with
    ``decoded`` > 0, ``add_to_pack`` adds the pixels of that share of the images."""

    def __init__(self, folder: ImageFolder, decoded: float = 0.0):
        if not 0.0 <= decoded <= 1.0:
            raise ValueError(f"decoded must be a share of the images in [0, 1], got {decoded!r}")
        self.folder, self.decoded = folder, float(decoded)

    @property
    def stored(self) -> str:
        """What the pack holds, for its identity: a pack of another form is never read as this
        one, nor images held decoded with other settings (``ImageReader.decoding``)."""
        if not self.decoded:
            return "encoded"
        return f"encoded, {self.decoded!r} decoded with {json.dumps(self.folder.decoding, sort_keys=True)}"

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> dict:
        path = self.folder.locate(i)
        return {"x": _read(path, self.folder.max_bytes), "y": self.folder.labels_of(np.asarray([i]))[0]}

    def add_to_pack(self, directory: Path, check: Callable[[], None] = lambda: None) -> None:
        """What ``pack`` writes beside the shards: the ``decoded`` share of the images decoded
        (``decoded_pixels.py``), if any; ``check()`` raises to stop it (a closed loader)."""
        if self.decoded:
            write_decoded(len(self), self.decoded, self._decoded, directory, self.folder.decoding, check)

    def _decoded(self, i: int) -> np.ndarray | None:
        try:
            return self.folder.load(self.folder.locate(i))
        except DataError:  # held as bytes alone: reading it decodes them, and fails as the folder does
            return None

    def locate(self, i: int) -> str:
        return self.folder.locate(i)


class PackedImages:
    """``folder``'s samples decoded from ``records``, the pack of ``EncodedImages(folder)``."""

    def __init__(self, folder: ImageFolder, records: Any):
        if len(records) != len(folder):
            raise DataError(f"{records!r} holds {len(records)} records for the {len(folder)} images of {folder!r}")
        self.folder, self.records = folder, records
        self.decoded = DecodedPixels.beside(records, folder)  # pack_decoded's share, if the pack holds one

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> dict:
        if self.decoded is not None and self.decoded.holds(np.asarray([i]))[0]:
            x = self.decoded.read(i)
        else:
            x = self.folder.decode(self.records[i]["x"], self.folder.locate(i))
        return {"x": x, "y": self.folder.labels_of(np.asarray([i]))[0]}

    def read_batch(self, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None) -> dict[str, np.ndarray]:
        """``{"x": (len(ids), h, w, channels) uint8, "y": int64}``, as ``ImageFolder.read_batch``
        (``allocate`` too); the images held decoded are read straight into their rows."""
        ids = self.folder.check_ids(ids)
        if self.decoded is None:
            return self._batch(ids, np.zeros(len(ids), bool), None, allocate)
        held = self.decoded.holds(ids)
        with self.decoded.reading(ids[held]) as read:
            return self._batch(ids, held, read, allocate)

    def _batch(
        self, ids: np.ndarray, held: np.ndarray, read: Callable | None, allocate: Allocator | None
    ) -> dict[str, np.ndarray]:
        """The batch of ``ids``: those ``held`` decoded read by ``read(i, into)`` (None when none
        is held), the others decoded."""
        encoded = iter(self.records.read_bytes(ids[~held], "x"))
        # one name for all: an error here only sends the loader to self[i], which names the file
        images = (
            (functools.partial(read, i) if h else next(encoded), "a packed image")  # type: ignore[arg-type, misc]
            for i, h in zip(ids.tolist(), held.tolist())
        )
        return decode_columns(self.folder, images, self.folder.labels_of(ids), allocate)

    @property
    def data_files(self) -> list[str]:
        """The files an epoch reads (what ``pack_to`` hands to the kernel's readahead): the
        shards unless every image is held decoded, and the decoded share's pixels."""
        if self.decoded is None:
            return list(self.records.paths)
        held = self.decoded.holds(np.arange(len(self)))
        return ([] if held.all() else list(self.records.paths)) + [self.decoded.path]

    def locate(self, i: int) -> str:
        return f"{self.folder.locate(i)} (packed: {self.records.locate(i)})"

    def close(self) -> None:
        close_source(self.records)
        close_source(self.decoded)

    def __repr__(self) -> str:
        return f"PackedImages({self.folder!r}, from {self.records!r})"
