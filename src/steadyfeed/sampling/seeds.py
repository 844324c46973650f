"""Random streams keyed by what they are for, never by adding numbers.

Per-sample streams are counter-based (as in JAX and Random123): a Philox generator
whose 128-bit key is hashed from the seed (``SeedSequence``) and whose 256-bit counter
holds (epoch, sample id, draw) in separate words. Philox is a keyed bijection, so
distinct (seed, epoch, id, draw) tuples give unrelated streams that cannot overlap:
(seed s, id i+1) and (seed s+1, id i) share nothing, unlike ``seed + index`` schemes.
Setting a counter costs about a microsecond, so every sample can afford its own stream.

``draw`` tells apart repeated draws of one id within an epoch (weighted sampling with
replacement), so each repetition gets its own augmentation: it is the appearance's position
in the epoch's order (0 for samplers that never repeat an id).
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


def _sample_key(seed: int) -> np.ndarray:
    return np.random.SeedSequence([_check_seed(seed), _SAMPLE_STREAM]).generate_state(2, np.uint64)


def _counter(epoch: int, sample_id: int, draw: int) -> np.ndarray:
    # the lowest word is the one Philox advances as the stream is consumed
    return np.array([0, draw, sample_id, epoch], dtype=np.uint64)


def sample_rng(seed: int, epoch: int, sample_id: int, draw: int = 0) -> np.random.Generator:
    """A fresh generator equal to the one a transform receives for this sample."""
    bits = np.random.Philox(key=_sample_key(seed), counter=_counter(epoch, sample_id, draw))
    return np.random.Generator(bits)


class SampleStreams:
    """One reusable generator, reset to each sample's stream in turn (for a worker).

    The generator handed out is valid for the duration of one transform call; a
    transform that keeps it must ``copy.deepcopy`` it.
    """

    def __init__(self, seed: int):
        self._key = _sample_key(seed)
        self._bits = np.random.Philox(key=self._key)
        self._generator = np.random.Generator(self._bits)
        self._spent_buffer = np.zeros(4, dtype=np.uint64)

    def rng(self, epoch: int, sample_id: int, draw: int = 0) -> np.random.Generator:
        self._bits.state = {
            "bit_generator": "Philox",
            "state": {"counter": _counter(epoch, sample_id, draw), "key": self._key},
            "buffer": self._spent_buffer,
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self._generator


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator that orders (shuffles or draws) the samples of one epoch."""
    seq = np.random.SeedSequence([_check_seed(seed), _ORDER_STREAM], spawn_key=(int(epoch),))
    return np.random.Generator(np.random.PCG64(seq))
