"""Random streams derived by hashing, never by adding numbers.

Every stream is a ``SeedSequence`` whose entropy is ``[seed, purpose]`` and whose
spawn key has a fixed length per purpose, so two different tuples never share a
stream: (seed s, sample i+1) and (seed s+1, sample i) are unrelated, unlike the
``seed + index`` schemes of other loaders.
"""
from __future__ import annotations

import numpy as np

_SAMPLE_STREAM = 1
_ORDER_STREAM = 2


def _check_seed(seed: int) -> int:
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return seed


def sample_rng(seed: int, epoch: int, sample_id: int, draw: int = 0) -> np.random.Generator:
    """The generator a transform receives for one sample.

    ``draw`` tells apart repeated draws of the same id within one epoch (weighted
    sampling with replacement), so each repetition gets its own augmentation.
    """
    seq = np.random.SeedSequence(
        [_check_seed(seed), _SAMPLE_STREAM], spawn_key=(int(epoch), int(sample_id), int(draw))
    )
    return np.random.Generator(np.random.PCG64(seq))


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator that orders (shuffles or draws) the samples of one epoch."""
    seq = np.random.SeedSequence([_check_seed(seed), _ORDER_STREAM], spawn_key=(int(epoch),))
    return np.random.Generator(np.random.PCG64(seq))
