"""Sampling: per-epoch order (sequential, shuffled, weighted), sharding, elastic resume, per-sample seeds."""

from .elastic import Remainder, merge_states
from .permutation import Permutation
from .plan import BatchSpec, EpochPlan, build_plan
from .samplers import ORDER_FORMAT, Order, Sampler, SequentialSampler, ShuffleSampler, WeightedSampler
from .seeds import order_rng, sample_rng

__all__ = [
    "BatchSpec",
    "EpochPlan",
    "ORDER_FORMAT",
    "Order",
    "Permutation",
    "Remainder",
    "build_plan",
    "merge_states",
    "Sampler",
    "SequentialSampler",
    "ShuffleSampler",
    "WeightedSampler",
    "order_rng",
    "sample_rng",
]
