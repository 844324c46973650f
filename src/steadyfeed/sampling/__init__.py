"""Sampling: per-epoch order (sequential, shuffled, weighted), sharding, per-sample seeds."""
from .plan import BatchSpec, build_plan
from .samplers import Sampler, SequentialSampler, ShuffleSampler, WeightedSampler
from .seeds import order_rng, sample_rng

__all__ = [
    "BatchSpec",
    "build_plan",
    "Sampler",
    "SequentialSampler",
    "ShuffleSampler",
    "WeightedSampler",
    "order_rng",
    "sample_rng",
]
