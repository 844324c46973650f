"""steadyfeed: feed larger-than-memory data to Keras 3 through concurrent workers,
exactly once, reproducibly, and never silently or stuck."""

from typing import TYPE_CHECKING, Any

from . import sources as _sources
from .config import ExecutionOptions, FailureOptions, LoaderConfig, ReadOptions, ShardOptions
from .errors import (
    CollateError,
    DataError,
    DiskFull,
    NoSpace,
    RayClusterLost,
    SampleError,
    SampleTimeout,
    SharedMemoryFull,
    SteadyfeedError,
    TooManyErrors,
    WorkerDied,
)
from .loader import Loader
from .locking import serialized
from .packing import pack
from .quality import Checked
from .sampling import SequentialSampler, ShuffleSampler, WeightedSampler, merge_states, sample_rng
from .sources import ArraySource, CsvSource, DiskCache, MemoryCache, Mixture, NpyArray, NpyPairs, TFRecordSource

if TYPE_CHECKING:  # the optional sources as type checkers see them; at run time __getattr__ imports them
    from .sources.hdf5 import Hdf5Source
    from .sources.images import ImageFolder, decode_image
    from .sources.parquet import ParquetSource
    from .sources.webdataset import WebDatasetSource

__version__ = "0.1.0"

__all__ = [
    # sorted (tests/test_typing.py); the optional sources too (sources.OPTIONAL)
    "ArraySource",
    "Checked",
    "CollateError",
    "CsvSource",
    "DataError",
    "DiskCache",
    "DiskFull",
    "ExecutionOptions",
    "FailureOptions",
    "Hdf5Source",
    "ImageFolder",
    "Loader",
    "LoaderConfig",
    "MemoryCache",
    "Mixture",
    "NoSpace",
    "NpyArray",
    "NpyPairs",
    "ParquetSource",
    "RayClusterLost",
    "ReadOptions",
    "SampleError",
    "SampleTimeout",
    "SequentialSampler",
    "ShardOptions",
    "SharedMemoryFull",
    "ShuffleSampler",
    "SteadyfeedError",
    "TFRecordSource",
    "TooManyErrors",
    "WebDatasetSource",
    "WeightedSampler",
    "WorkerDied",
    "decode_image",
    "merge_states",
    "pack",
    "sample_rng",
    "serialized",
]


def __getattr__(name: str) -> Any:
    if name in _sources.OPTIONAL:  # optional-dependency sources load on first use
        return getattr(_sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
