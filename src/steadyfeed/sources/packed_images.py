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

Both pickle as the folder's paths and settings, so process workers read them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import close_source
from .images import ImageFolder, _read, decode_batch


class EncodedImages:
    """``folder``'s samples as packed: each file's bytes (``"x"``) and label (``"y"``)."""

    def __init__(self, folder: ImageFolder):
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> dict:
        path = self.folder.locate(i)
        return {"x": _read(path, self.folder.max_bytes), "y": self.folder.labels_of(np.asarray([i]))[0]}

    def locate(self, i: int) -> str:
        return self.folder.locate(i)


class PackedImages:
    """``folder``'s samples decoded from ``records``, the pack of ``EncodedImages(folder)``."""

    def __init__(self, folder: ImageFolder, records: Any):
        if len(records) != len(folder):
            raise DataError(f"{records!r} holds {len(records)} records for the {len(folder)} images of {folder!r}")
        self.folder, self.records = folder, records

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> dict:
        data = self.records[i]["x"]
        return {"x": self.folder.decode(data, self.folder.locate(i)), "y": self.folder.labels_of(np.asarray([i]))[0]}

    def read_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """``{"x": (len(ids), h, w, channels) uint8, "y": int64}``, as ``ImageFolder.read_batch``."""
        ids = self.folder.check_ids(ids)
        # one name for all: an error here only sends the loader to self[i], which names the file
        encoded = ((data, "a packed image") for data in self.records.read_bytes(ids, "x"))
        return {"x": decode_batch(self.folder, encoded, len(ids)), "y": self.folder.labels_of(ids)}

    def locate(self, i: int) -> str:
        return f"{self.folder.locate(i)} (packed: {self.records.locate(i)})"

    def close(self) -> None:
        close_source(self.records)

    def __repr__(self) -> str:
        return f"PackedImages({self.folder!r}, from {self.records!r})"
