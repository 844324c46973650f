"""Fixed-size rows at known file offsets, read with one ``preadv`` per span of nearby rows.

Shared by ``Hdf5Source`` (uncompressed datasets) and ``NpyArray`` (C-order ``.npy`` files).
A read, never a mapping: a file that shrinks while in use gives a short read and an error
naming it, where touching a mapped page past the new end would kill the process (SIGBUS).
``os.preadv`` releases the GIL and shares no file position, so thread workers read in parallel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .base import pread_fully

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers one preadv takes
GAP_BYTES = 64 * 1024  # unrequested bytes worth reading to save one read call (sources pass it in)
# One HDF5 call costs about 10 us, one preadv about 2 us: one rule serves both. 32 scattered int64
# labels of 20,000 take about 16 us as one span read against 40 us as 32 preadv (measured);
# 16-256 KB all do.


class RawRows(NamedTuple):
    """Where the rows lie: chunk ``k`` (``rows_per_chunk`` whole rows, or all of them when the
    data is contiguous) starts at byte ``offsets[k]`` of the file.

    ``extents[k]`` numbers the stretches of chunks that follow each other in the file in row
    order, so that nearby rows of one extent share one read even across chunk boundaries (a
    batch of consecutive rows is one read). Reads never cross extents: HDF5 puts other objects
    (chunk index nodes, other datasets' chunks) between chunks and may store chunks out of order.
    """

    offsets: np.ndarray
    rows_per_chunk: int
    row_bytes: int
    extents: np.ndarray

    @classmethod
    def contiguous(cls, offset: int, rows: int, row_bytes: int) -> RawRows:
        return cls(np.array([offset], np.int64), rows, row_bytes, np.zeros(1, np.int64))


def spans(ids: np.ndarray, max_gap: int) -> list[tuple[int, int]]:
    """``(a, b)`` index ranges of sorted unique ``ids`` where no two neighbours are more than
    ``max_gap`` ids apart (``max_gap=0``: runs of consecutive ids)."""
    if ids[-1] - ids[0] + 1 == len(ids):  # one run, e.g. a single id or an unshuffled batch
        return [(0, len(ids))]
    # per batch, not per row: slicing beats np.diff and lists beat np.concatenate at this size
    bounds = [0, *(np.flatnonzero(ids[1:] - ids[:-1] > max_gap + 1) + 1).tolist(), len(ids)]
    return list(zip(bounds[:-1], bounds[1:]))


def raw_reads(raw: RawRows, ids: np.ndarray, gap_bytes: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The reads for sorted unique ``ids``: ``(a, b)`` ranges of ``ids`` as :func:`spans` makes
    them (up to ``gap_bytes`` unrequested bytes inside one), never across extents, and the file
    offsets of the rows (at least of each range's first)."""
    per, rb = raw.rows_per_chunk, raw.row_bytes
    first, last = int(ids[0]), int(ids[-1])
    if last - first + 1 == len(ids) and raw.extents[first // per] == raw.extents[last // per]:
        # one run within one extent (an unshuffled batch): skip the per-row arrays, a few us per batch
        return [(0, len(ids))], [int(raw.offsets[first // per]) + first % per * rb]
    chunk, within = np.divmod(ids, per)
    gap = gap_bytes // max(rb, 1)
    # rows of different extents must not share a read: spaced more than gap apart, spans splits there
    return spans(ids + raw.extents[chunk] * (gap + 1), gap), (raw.offsets[chunk] + within * rb).tolist()


def read_rows(
    fd: int, raw: RawRows, ids: np.ndarray, out: np.ndarray, gap_bytes: int, places: np.ndarray | None = None
) -> tuple[int, int] | None:
    """Rows ``ids`` (sorted, unique) into ``out`` (the bytes of one row per output row): id
    ``ids[j]`` into row ``places[j]`` (None: row ``j``). Returns None, or the first and last id
    of a read that ended past the end of the file.

    File offsets come from numpy, so Python loops once per read, not once per row. A span
    stays within one extent of the file, where row ``i`` lies ``row_bytes * (i - start)`` past
    the span's first row ``start``, chunk boundaries or not. A run of consecutive ids goes
    straight into its rows (one buffer when they are consecutive rows, else one per row: a
    shuffled batch is read in file order with no reordered copy of itself, which cost a
    fresh batch's page faults each time); ids a few rows apart share a read of their span,
    then copied to their rows.
    """
    rb = raw.row_bytes
    reads, offsets = raw_reads(raw, ids, gap_bytes)
    # (ignore: numpy's stubs give ndarray a __buffer__ on Python >= 3.12 only)
    flat, listed = memoryview(out.reshape(-1)), ids.tolist()  # type: ignore[arg-type]  # slicing these is cheap
    rows = range(len(listed)) if places is None else places.tolist()
    for a, b in reads:
        start, last = listed[a], listed[b - 1]
        span = None if last - start + 1 == b - a else np.empty((last - start + 1, rb), np.uint8)
        if span is not None:  # ids a few rows apart: their span, then the rows copied out
            views = [memoryview(span.reshape(-1))]  # type: ignore[arg-type]
        elif places is None or _consecutive(rows[a:b]):
            views = [flat[rows[a] * rb : (rows[a] + b - a) * rb]]
        else:
            views = [flat[r * rb : (r + 1) * rb] for r in rows[a:b]]
        if _preadv_fully(fd, views, offsets[a]):
            return start, last
        if span is not None:
            out[slice(a, b) if places is None else places[a:b]] = span[ids[a:b] - start]
    return None


def _consecutive(rows: Sequence[int]) -> bool:
    return list(rows) == list(range(rows[0], rows[0] + len(rows)))


def _preadv_fully(fd: int, views: list[memoryview], offset: int) -> int:
    """Fill ``views`` one after the other from byte ``offset`` of ``fd``, at most ``IOV_MAX``
    to a call; returns how many bytes were missing at the end of the file, 0 when all are full."""
    for k in range(0, len(views), IOV_MAX):
        part = views[k : k + IOV_MAX]
        wanted = sum(map(len, part))
        if os.preadv(fd, part, offset) != wanted:  # rare (a signal, the end of the file): view by view
            for view in part:
                missing = pread_fully(fd, view, offset)
                if missing:
                    return missing
                offset += len(view)
        else:
            offset += wanted
    return 0


class FileOrder(NamedTuple):
    """The ids of a batch in the order they are read: ``unique`` (sorted, each once) into
    ``places`` (the batch's row for each; None: row ``j``, the ids were increasing), then each
    row that repeats an id (``repeats``) copied from the row that id was read into (``copied_from``)."""

    unique: np.ndarray
    places: np.ndarray | None
    repeats: np.ndarray | None
    copied_from: np.ndarray | None

    @classmethod
    def of(cls, ids: np.ndarray) -> FileOrder:
        if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):
            return cls(ids, None, None, None)
        order = np.argsort(ids, kind="stable")
        ranked = ids[order]
        first = np.empty(len(ids), bool)  # the first of each run of one id in file order
        first[0], first[1:] = True, ranked[1:] != ranked[:-1]
        places = order[first]
        owner = np.cumsum(first) - 1  # for each ranked id, its place among the unique ones
        return cls(ranked[first], places, order[~first], places[owner[~first]])

    def fill_repeats(self, columns: dict[str, np.ndarray]) -> None:
        if self.repeats is not None and len(self.repeats):
            for column in columns.values():
                column[self.repeats] = column[self.copied_from]
