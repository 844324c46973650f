"""Exclusion: sample ids left out of epochs, by a recorded policy, as part of the plan.

:class:`Exclusions` is the record: each excluded id, why, and the first epoch it is left out
of. It is immutable (``add`` returns a new record), JSON-able (``as_state`` / ``from_state``,
part of a loader's state) and costs O(excluded) memory.

:func:`excluding` lays a record's ids over an epoch's lazy order: the result is an order of
``len(order) - (appearances of excluded ids)`` positions holding every other position of
``order``, in order. Sharding, ``last_batch`` and elastic resume then work on it as on any
order (``plan.py``), so every shard count, policy, worker count and mode delivers each
remaining sample exactly once and no excluded one. Guarantees:

* **O(excluded), never O(N)** for the built-in orders: the positions of the excluded ids are
  found by inverting the order (``positions_of``: the identity for a sequential order, the
  inverse Feistel network for a shuffled one), kept as one sorted array, and position ``q`` of
  the result is ``q + #{excluded positions s_j with s_j - j <= q}`` (one ``searchsorted``);
* an order that cannot be inverted (a weighted draw, a custom lazy order) is scanned once, a
  block at a time: O(N) time, memory O(appearances of excluded ids);
* ``source_positions`` maps the result's positions back to ``order``'s, so an id's random
  stream (its draw) does not change when other ids are excluded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCAN_BLOCK = 1 << 16  # positions per pass when an order has to be scanned for excluded ids


@dataclass(frozen=True)
class Exclusions:
    """Excluded ids (sorted, unique), each with the first epoch it is left out of and a reason."""

    ids: np.ndarray  # int64, sorted, unique
    from_epoch: np.ndarray  # int64, one per id
    reasons: tuple[str, ...]  # one per id

    @classmethod
    def none(cls) -> Exclusions:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), ())

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids, reason: str, from_epoch: int) -> Exclusions:
        """This record with ``ids`` excluded from ``from_epoch`` on; an id already excluded
        keeps its earlier record (first epoch and reason)."""
        new = np.setdiff1d(np.unique(np.asarray(ids, dtype=np.int64).reshape(-1)), self.ids)
        if not len(new):
            return self
        ids = np.concatenate([self.ids, new])
        epochs = np.concatenate([self.from_epoch, np.full(len(new), int(from_epoch), np.int64)])
        reasons = self.reasons + (str(reason),) * len(new)
        order = np.argsort(ids, kind="stable")
        return Exclusions(ids[order], epochs[order], tuple(reasons[i] for i in order))

    def merged(self, other: Exclusions) -> Exclusions:
        """Both records; an id in both keeps this one's entry."""
        ids = np.concatenate([self.ids, other.ids])
        epochs = np.concatenate([self.from_epoch, other.from_epoch])
        reasons = self.reasons + other.reasons
        ids, first = np.unique(ids, return_index=True)  # the first occurrence: this record's
        return Exclusions(ids, epochs[first], tuple(reasons[i] for i in first))

    def at(self, epoch: int) -> np.ndarray:
        """The ids left out of epoch ``epoch`` (sorted)."""
        return self.ids[self.from_epoch <= int(epoch)]

    def report(self, epoch: int | None = None) -> list[dict]:
        """The findings' ``"excluded"`` section (``{"id", "reason", "from_epoch"}``), for one
        epoch or all."""
        keep = range(len(self.ids)) if epoch is None else np.flatnonzero(self.from_epoch <= int(epoch))
        return [
            {"id": int(self.ids[i]), "reason": self.reasons[i], "from_epoch": int(self.from_epoch[i])} for i in keep
        ]

    def as_state(self) -> dict | None:
        """JSON-able columns (None when nothing is excluded)."""
        if not len(self.ids):
            return None
        return {"ids": self.ids.tolist(), "from_epoch": self.from_epoch.tolist(), "reasons": list(self.reasons)}

    @classmethod
    def from_state(cls, state: dict | None) -> Exclusions:
        if not state:
            return cls.none()
        ids, epochs, reasons = (
            np.asarray(state["ids"], np.int64),
            np.asarray(state["from_epoch"], np.int64),
            tuple(str(r) for r in state["reasons"]),
        )
        if not (len(ids) == len(epochs) == len(reasons)) or len(np.unique(ids)) != len(ids):
            raise ValueError("a loader state's excluded ids are malformed (columns of unequal length or repeats)")
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], epochs[order], tuple(reasons[i] for i in order))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Exclusions)
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.from_epoch, other.from_epoch)
            and self.reasons == other.reasons
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, so not hashable


class ExcludingOrder:
    """``order`` less the positions ``excluded`` (sorted, unique positions of ``order``)."""

    def __init__(self, order, excluded: np.ndarray):
        self.order = order
        self.may_repeat = bool(getattr(order, "may_repeat", False))
        self._shifted = excluded - np.arange(len(excluded), dtype=np.int64)  # non-excluded positions before each
        self.length = len(order) - len(excluded)

    def __len__(self) -> int:
        return self.length

    def source_positions(self, positions) -> np.ndarray:
        """Where this order's ``positions`` lie in the order it excludes from."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions + np.searchsorted(self._shifted, positions, side="right")

    def take(self, positions) -> np.ndarray:
        return self.order.take(self.source_positions(positions))


def excluding(order, ids: np.ndarray):
    """``order`` without the appearances of ``ids`` (see the module docstring); ``order`` itself
    when none of them appears."""
    if not len(ids):
        return order
    positions = excluded_positions(order, np.asarray(ids, dtype=np.int64))
    return ExcludingOrder(order, positions) if len(positions) else order


def excluded_positions(order, ids: np.ndarray) -> np.ndarray:
    """The sorted positions of ``order`` that hold one of ``ids``."""
    invert = getattr(order, "positions_of", None)
    if invert is not None:
        return np.unique(invert(ids))
    found = []
    for start in range(0, len(order), SCAN_BLOCK):  # no inverse: one pass, a block at a time
        block = np.arange(start, min(start + SCAN_BLOCK, len(order)), dtype=np.int64)
        found.append(block[np.isin(order.take(block), ids)])
    return np.concatenate(found) if found else np.zeros(0, np.int64)
