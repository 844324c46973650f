"""Elastic resume: the rest of an epoch that N shards left, planned anew on M shards.

A mid-epoch state of shard ``r`` of ``R`` says how many of its positions it delivered,
``d[r]``: shard ``r`` took positions ``r, r + R, r + 2R, ...`` of the epoch's order
(``plan.py``), so it delivered exactly the positions ``r + R*j`` with ``j < d[r]``.
:class:`Remainder` is every other position, in order: a sequence the new shards split
round-robin under their own ``last_batch`` policy like any epoch. Guarantees:

* the remainder holds each position of the epoch that no old shard delivered, exactly once,
  and none that one did; so old and new shards together deliver every sample of the epoch
  exactly once (under ``"drop"``, the remainder's own tail is dropped as an epoch's is);
* it is described by ``(R, d)`` alone and evaluated lazily: positions below ``R*min(d)``
  were all delivered and positions from ``R*max(d)`` on all remain, so only the ragged band
  between them is listed (``R*(max(d) - min(d))`` positions at most: shards that stop
  together leave at most ``R * batch_size``);
* remainders nest: a resumed epoch checkpointed again on M shards and resumed on P maps
  back through both levels.

:func:`merge_states` turns the N states into one that any shard of a loader with any
shard count accepts (``Loader.load_state_dict``).
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

import numpy as np

from .plan import shard_size


class Remainder:
    """The positions of an order of ``length`` that shards ``0..R-1`` had not delivered
    (``delivered[r]`` positions of shard r each), in order."""

    def __init__(self, length: int, delivered):
        self.parent_length = int(length)
        self.delivered = [int(d) for d in delivered]
        count = len(self.delivered)
        if count < 1 or any(d < 0 for d in self.delivered):
            raise ValueError(f"delivered must hold one count >= 0 per shard, got {self.delivered}")
        self.shard_count = count
        high = max(self.delivered)
        starts = [r + count * d for r, d in enumerate(self.delivered)]
        bands = [np.arange(start, count * high, count, dtype=np.int64) for start in starts]
        band = np.sort(np.concatenate(bands)) if bands else np.zeros(0, np.int64)
        self.band = band[band < self.parent_length]  # the ragged part, listed
        self.tail_start = count * high  # every position from here on remains
        self.length = len(self.band) + max(0, self.parent_length - self.tail_start)

    def __len__(self) -> int:
        return self.length

    def take(self, positions) -> np.ndarray:
        """The parent positions of remainder ``positions``."""
        positions = np.asarray(positions, dtype=np.int64)
        in_band = positions < len(self.band)
        out = self.tail_start + (positions - len(self.band))
        out[in_band] = self.band[positions[in_band]]
        return out


def remainder_chain(order_length: int, levels: list) -> Remainder | None:
    """The nested remainders of ``levels`` (each ``{"delivered": [...]}``, oldest first)."""
    chain, length = None, int(order_length)
    for level in levels:
        parent = chain
        rest = Remainder(length, level["delivered"])
        chain = rest if parent is None else _Nested(parent, rest)
        length = len(rest)
    return chain


class _Nested:
    """A remainder of a remainder: positions map through the inner level, then the outer."""

    def __init__(self, outer, inner: Remainder):
        self.outer, self.inner = outer, inner

    def __len__(self) -> int:
        return len(self.inner)

    def take(self, positions) -> np.ndarray:
        return self.outer.take(self.inner.take(positions))


def _fail(message: str) -> NoReturn:
    raise ValueError(f"cannot merge these loader states: {message}")


def merge_states(states: list[dict]) -> dict:
    """One loader state from the states of all N shards of one run (mid-epoch or not), which
    a loader with any ``shard_count`` (and any ``shard_index``) accepts: the rest of that
    epoch is then delivered exactly once across the new shards, with their ``last_batch``
    policy applied to it; later epochs are planned for the new shards as usual.

    The states must come from one run: the same data, plan and epoch (a shard that already
    finished the epoch may be at the start of the next), one state per shard index, and the
    same excluded ids (``Loader.exclude``), which the merged state keeps."""
    from ..loader import check_state_format

    states = [copy.deepcopy(dict(s)) for s in states]
    if not states:
        _fail("no states given")
    for state in states:
        check_state_format(state)
    first = states[0]
    if any(s["fingerprint"] != first["fingerprint"] for s in states):
        _fail("they were saved by loaders with different data or plans (their fingerprints differ)")
    if any(s.get("excluded") != first.get("excluded") for s in states):
        _fail("their loaders excluded different ids (every shard must exclude the same: loader.exclude on each)")
    shards: list[Any] = [s.get("shard") for s in states]  # None: refused next
    if any(s is None for s in shards):
        _fail("a state is itself a merge; merge the states its loaders saved")
    count = shards[0]["count"]
    if any(s["count"] != count for s in shards) or sorted(s["index"] for s in shards) != list(range(count)):
        _fail(
            f"need exactly one state per shard 0..{count - 1}, got shards "
            f"{sorted((s['index'], s['count']) for s in shards)}"
        )
    epoch = min(s["epoch"] for s in states)
    for s in states:
        if not (s["epoch"] == epoch or (s["epoch"] == epoch + 1 and s["next_batch"] == 0)):
            _fail(
                f"shard {s['shard']['index']} is at epoch {s['epoch']} batch {s['next_batch']}, "
                f"another at epoch {epoch}: more than one epoch apart"
            )
    current = [s for s in states if s["epoch"] == epoch]
    levels = _levels(current[0], epoch)
    if any(_levels(s, epoch) != levels for s in current):
        _fail(f"the shards resumed epoch {epoch} from different merged states")
    order_length = current[0]["order_length"]
    if len(current) == len(states) and all(s["next_batch"] == 0 for s in states):  # none began it
        return _merged(first, epoch, levels, order_length)
    chain = remainder_chain(order_length, levels)
    length = order_length if chain is None else len(chain)
    batch, policy = first["fingerprint"]["batch_size"], first["fingerprint"]["last_batch"]
    delivered = [0] * count
    for s in states:
        r = s["shard"]["index"]
        size = shard_size(length, r, count, policy)
        if policy == "drop":
            size = (size // batch) * batch
        done = s["epoch"] > epoch  # it finished the epoch: all of its positions
        delivered[r] = size if done else min(s["next_batch"] * batch, size)
    return _merged(first, epoch, [*levels, {"shard_count": count, "delivered": delivered}], order_length)


def _levels(state: dict, epoch: int) -> list:
    rest = state.get("remainder")
    return list(rest["levels"]) if rest and rest["epoch"] == epoch else []


def _merged(first: dict, epoch: int, levels: list, order_length: int) -> dict:
    from ..loader import STATE_FORMAT

    return {
        "format": STATE_FORMAT,
        "epoch": epoch,
        "next_batch": 0,
        "fingerprint": first["fingerprint"],
        "shard": None,
        "order_length": order_length,
        "remainder": {"epoch": epoch, "levels": levels} if levels else None,
        "excluded": first.get("excluded"),
    }
