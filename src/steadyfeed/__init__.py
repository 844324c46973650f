"""steadyfeed: feed larger-than-memory data to Keras 3 through concurrent workers,
exactly once, reproducibly, and never silently or stuck."""
from .config import ExecutionOptions, FailureOptions, LoaderConfig, ReadOptions, ShardOptions
from .errors import (
    CollateError, DataError, DiskFull, NoSpace, RayClusterLost, SampleError, SampleTimeout, SharedMemoryFull,
    SteadyfeedError, TooManyErrors, WorkerDied,
)
from .loader import Loader
from .locking import serialized
from .packing import pack
from .quality import Checked
from .sampling import SequentialSampler, ShuffleSampler, WeightedSampler, merge_states, sample_rng
from .sources import ArraySource, CsvSource, DiskCache, MemoryCache, Mixture, NpyArray, NpyPairs, TFRecordSource

from . import sources as _sources

__version__ = "0.1.0"

__all__ = [
    "ArraySource",
    "Checked",
    "CollateError",
    "CsvSource",
    "DataError",
    "DiskCache",
    "DiskFull",
    "ExecutionOptions",
    "FailureOptions",
    "Loader",
    "LoaderConfig",
    "MemoryCache",
    "Mixture",
    "NpyArray",
    "NoSpace",
    "NpyPairs",
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
    "WeightedSampler",
    "WorkerDied",
    "merge_states",
    "pack",
    "sample_rng",
    "serialized",
    *_sources.OPTIONAL,
]


def __getattr__(name: str):
    if name in _sources.OPTIONAL:  # optional-dependency sources load on first use
        return getattr(_sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
