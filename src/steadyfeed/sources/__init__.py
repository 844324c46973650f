"""Sources: random-access datasets. See ``base.py`` for the protocol.

Sources that need an optional package (Pillow, h5py, protobuf) are imported on first
use, so ``import steadyfeed`` needs numpy alone.
"""

import importlib

from .array import ArraySource
from .base import Source
from .cache import DiskCache, MemoryCache
from .csv_rows import CsvSource
from .mixture import Mixture
from .npy import NpyArray, NpyPairs, read_npy
from .tfrecord import TFRecordSource

# name -> module that defines it, imported when the name is first used
OPTIONAL = {
    "Hdf5Source": ".hdf5",
    "ImageFolder": ".images",
    "decode_image": ".images",
    "ParquetSource": ".parquet",
    "WebDatasetSource": ".webdataset",
}

__all__ = [
    "ArraySource",
    "CsvSource",
    "DiskCache",
    "MemoryCache",
    "Mixture",
    "NpyArray",
    "NpyPairs",
    "Source",
    "TFRecordSource",
    "read_npy",
    *OPTIONAL,
]


def __getattr__(name: str):
    if name in OPTIONAL:
        return getattr(importlib.import_module(OPTIONAL[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
