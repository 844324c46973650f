"""The plan of one epoch for one shard: which ids go into which batch, computed on demand.

The plan is computed in the consumer from (sampler, seed, epoch, shard) alone, so it
is identical for every worker count and execution mode; workers only carry it out.
:class:`EpochPlan` holds a few integers and the epoch's lazy order: ``plan[i]`` computes
batch ``i``'s :class:`BatchSpec` from arithmetic on its positions, ``len(plan)`` and the
sample counts are closed forms, so a plan over 10**12 samples costs what one over 10 does.

Sharding splits the global order round-robin (replica r takes positions r, r+R, ...).
With ``last_batch="drop"`` every replica keeps ``N // R`` samples and full batches only;
with ``"pad"`` every replica has ``ceil(N / R)`` slots and its last batch is padded to
``batch_size`` with masked rows; either way every replica gets the same number of
batches. With ``"partial"`` replicas may differ by one sample (and so one batch).

An epoch resumed on another number of shards (``elastic.py``) is planned the same way
over what was left of it: ``remainder`` maps the plan's positions back to the order's.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .samplers import ArrayOrder

LastBatch = Literal["partial", "drop", "pad"]
LAST_BATCH_POLICIES: tuple[str, ...] = typing.get_args(LastBatch)
BLOCK_IDS = 4096  # positions computed per pass over the order (a few batches' worth: constant memory)


@dataclass(frozen=True)
class BatchSpec:
    """One batch of the plan: the ids to read, their draw numbers, and its padded size."""

    index: int
    ids: np.ndarray  # int64 sample ids, in batch order
    draws: np.ndarray | None  # per-id draw number when ids repeat within the epoch
    pad_to: int | None  # rows the batch must have under last_batch="pad"
    num_real: int  # ids[num_real:] are fillers, read only to give padded rows a shape (masked)

    def __reduce__(self):
        # ids and draws as their bytes: a task is pickled for every batch, and an array's own
        # reduce (numpy's reconstructor, its dtype) cost more than the rest of the task together
        return (_spec, (self.index, _packed(self.ids), _packed(self.draws), self.pad_to, self.num_real))


def _packed(ids: np.ndarray | None) -> tuple[str, bytes] | None:
    return None if ids is None else (ids.dtype.str, ids.tobytes())


def _unpacked(packed: tuple[str, bytes] | None) -> np.ndarray | None:
    # a copy: writable, as the consumer's arrays are (a source may sort the ids it is given)
    return None if packed is None else np.frombuffer(packed[1], packed[0]).copy()


def _spec(index: int, ids: tuple[str, bytes], draws: tuple[str, bytes] | None, pad_to: int | None, num_real: int):
    """A BatchSpec unpickled (``BatchSpec.__reduce__``)."""
    unpacked = _unpacked(ids)
    assert unpacked is not None  # every batch has ids
    return BatchSpec(index, unpacked, _unpacked(draws), pad_to, num_real)


def shard_size(length: int, shard_index: int, shard_count: int, last_batch: str) -> int:
    """How many positions of an order of ``length`` shard ``shard_index`` takes (its real samples)."""
    if last_batch == "drop":
        return length // shard_count
    return max(0, -(-(length - shard_index) // shard_count))


class EpochPlan:
    """The batches of one epoch of one shard, each computed when asked for.

    ``order`` is the epoch's lazy order (``samplers.Order``); ``remainder`` (optional)
    maps this plan's positions to the order's (an elastic resume, ``elastic.Remainder``).
    A batch's ``draws`` are the order positions of its ids when the order may repeat ids,
    so every appearance of an id gets its own random stream (positions of the order before
    any exclusion, ``exclusion.py``, so excluding one id changes no other id's stream).
    """

    def __init__(self, order, *, batch_size: int, shard_index: int, shard_count: int, last_batch: str, remainder=None):
        self.order, self.remainder = order, remainder
        self.batch_size, self.shard_index, self.shard_count = int(batch_size), int(shard_index), int(shard_count)
        self.last_batch = last_batch
        self.length = len(remainder) if remainder is not None else len(order)  # positions being sharded
        self.num_real_total = shard_size(self.length, self.shard_index, self.shard_count, last_batch)
        slots = math.ceil(self.length / self.shard_count) if last_batch == "pad" else self.num_real_total
        if last_batch == "drop":
            self.num_batches = slots // self.batch_size
            self.num_real_total = self.num_batches * self.batch_size
        else:
            self.num_batches = math.ceil(slots / self.batch_size)
        self._draws = bool(getattr(order, "may_repeat", False))
        self._block: tuple | None = None  # (first, stop, ids, positions) of the latest block of positions

    def __len__(self) -> int:
        return self.num_batches

    def delivered_before(self, batch_index: int) -> int:
        """How many of this shard's positions batches ``0..batch_index-1`` hold."""
        return min(int(batch_index) * self.batch_size, self.num_real_total)

    def order_positions(self, plan_positions: np.ndarray) -> np.ndarray:
        """Where ``plan_positions`` (positions being sharded) lie in the epoch's order."""
        return plan_positions if self.remainder is None else self.remainder.take(plan_positions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.num_batches))]
        index = int(index)
        if index < 0:
            index += self.num_batches
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} out of range: the plan has {self.num_batches} batches")
        lo = index * self.batch_size
        hi = min(lo + self.batch_size, self.num_real_total)
        num_real = max(0, hi - lo)
        if num_real:
            ids, positions = self._block_for(lo, hi)
        else:  # a batch made only of shard padding: borrow one id for its shape
            positions = self.order_positions(np.zeros(1, np.int64))
            ids = self.order.take(positions)
        return BatchSpec(
            index=index,
            ids=ids.copy(),  # the caller's own: a source may sort the ids it is given
            draws=self._draws_at(positions).copy() if self._draws else None,
            pad_to=self.batch_size if self.last_batch == "pad" else None,
            num_real=num_real,
        )

    def _draws_at(self, positions: np.ndarray) -> np.ndarray:
        """The draw numbers of these order positions: the positions in the order before exclusion."""
        before_exclusion = getattr(self.order, "source_positions", None)
        return positions if before_exclusion is None else before_exclusion(positions)

    def _block_for(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids and order positions of this shard's positions ``lo..hi-1``, computed a block of
        about ``BLOCK_IDS`` positions at a time: one vectorised pass over the order serves many
        batches (the order's cost is per call more than per id). Constant memory: one block,
        of which these are views (the caller copies what it keeps)."""
        block = self._block  # one read: a tuple replaced whole, never changed in place
        if block is None or not block[0] <= lo < hi <= block[1]:
            start = lo
            stop = min(self.num_real_total, start + max(BLOCK_IDS // self.batch_size, 1) * self.batch_size)
            local = np.arange(start, stop, dtype=np.int64)
            positions = self.order_positions(self.shard_index + self.shard_count * local)
            block = self._block = (start, stop, self.order.take(positions), positions)
        start = block[0]
        return block[2][lo - start : hi - start], block[3][lo - start : hi - start]

    def __iter__(self):
        return (self[i] for i in range(self.num_batches))

    def __repr__(self) -> str:
        return (
            f"EpochPlan({self.num_batches} batches of {self.batch_size}, shard {self.shard_index} of "
            f"{self.shard_count}, last_batch={self.last_batch!r}, {self.length} positions)"
        )


def build_plan(
    order: np.ndarray,
    *,
    batch_size: int,
    shard_index: int,
    shard_count: int,
    last_batch: str,
    with_draws: bool,
) -> EpochPlan:
    """The plan of an order given as an array (``with_draws``: its ids may repeat)."""
    return EpochPlan(
        ArrayOrder(order, may_repeat=with_draws),
        batch_size=batch_size,
        shard_index=shard_index,
        shard_count=shard_count,
        last_batch=last_batch,
    )
