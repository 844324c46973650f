"""The plan of one epoch for one shard: which ids go into which batch.

The plan is computed in the consumer from (sampler, seed, epoch, shard) alone, so it
is identical for every worker count and execution mode; workers only carry it out.

Sharding splits the global order round-robin (replica r takes positions r, r+R, ...).
With ``last_batch="drop"`` every replica keeps ``N // R`` samples and full batches only;
with ``"pad"`` every replica has ``ceil(N / R)`` slots and its last batch is padded to
``batch_size`` with masked rows; either way every replica gets the same number of
batches. With ``"partial"`` replicas may differ by one sample (and so one batch).
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

import numpy as np

LastBatch = Literal["partial", "drop", "pad"]
LAST_BATCH_POLICIES: tuple[str, ...] = typing.get_args(LastBatch)


@dataclass(frozen=True)
class BatchSpec:
    """One batch of the plan: the ids to read, their draw numbers, and its padded size."""

    index: int
    ids: np.ndarray  # int64 sample ids, in batch order
    draws: np.ndarray | None  # per-id draw number when ids repeat within the epoch
    pad_to: int | None  # rows the batch must have under last_batch="pad"
    num_real: int  # ids[num_real:] are fillers, read only to give padded rows a shape (masked)


def draw_numbers(order: np.ndarray) -> np.ndarray:
    """For each position, how many times its id already appeared earlier in ``order``."""
    sorter = np.argsort(order, kind="stable")
    sorted_ids = order[sorter]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_ids)) + 1]
    run_lengths = np.diff(np.r_[starts, len(order)])
    within_run = np.arange(len(order)) - np.repeat(starts, run_lengths)
    draws = np.empty(len(order), dtype=np.int64)
    draws[sorter] = within_run
    return draws


def shard_order(order: np.ndarray, shard_index: int, shard_count: int, last_batch: str) -> tuple[np.ndarray, int]:
    """This replica's ids and the number of slots it must fill (for padding)."""
    if last_batch == "drop":
        order = order[: (len(order) // shard_count) * shard_count]
    mine = order[shard_index::shard_count]
    slots = math.ceil(len(order) / shard_count) if last_batch == "pad" else len(mine)
    return mine, slots


def build_plan(
    order: np.ndarray,
    *,
    batch_size: int,
    shard_index: int,
    shard_count: int,
    last_batch: str,
    with_draws: bool,
) -> list[BatchSpec]:
    draws_all = draw_numbers(order) if with_draws else None
    positions = np.arange(len(order))
    mine, slots = shard_order(positions, shard_index, shard_count, last_batch)
    ids = order[mine]
    draws = draws_all[mine] if draws_all is not None else None
    if last_batch == "drop":
        num_batches = slots // batch_size
    else:
        num_batches = math.ceil(slots / batch_size)
    plan = []
    for b in range(num_batches):
        lo, hi = b * batch_size, min((b + 1) * batch_size, len(ids))
        batch_ids = ids[lo:hi]
        batch_draws = None if draws is None else draws[lo:hi]
        num_real = len(batch_ids)
        if num_real == 0:  # a batch made only of shard padding: borrow one id for its shape
            batch_ids = order[:1]
            batch_draws = None if draws is None else draws_all[:1]
        plan.append(
            BatchSpec(
                index=b,
                ids=batch_ids,
                draws=batch_draws,
                pad_to=batch_size if last_batch == "pad" else None,
                num_real=num_real,
            )
        )
    return plan
