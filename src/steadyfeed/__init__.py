"""steadyfeed: feed larger-than-memory data to Keras 3 through concurrent workers,
exactly once, reproducibly, and never silently or stuck."""
from .errors import DataError, SampleError, SampleTimeout, SteadyfeedError, TooManyErrors, WorkerDied
from .loader import Loader
from .sampling import SequentialSampler, ShuffleSampler, WeightedSampler, sample_rng
from .sources import ArraySource, NpyArray, NpyPairs

__version__ = "0.1.0"

__all__ = [
    "ArraySource",
    "DataError",
    "Loader",
    "NpyArray",
    "NpyPairs",
    "SampleError",
    "SampleTimeout",
    "SequentialSampler",
    "ShuffleSampler",
    "SteadyfeedError",
    "TooManyErrors",
    "WeightedSampler",
    "WorkerDied",
    "sample_rng",
]
