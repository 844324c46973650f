"""Near-duplicates: perceptual hashes that find re-encoded, resized or slightly cropped copies.

**The hash** (numpy only, vectorised over a batch): the image is made grey (Rec. 601) and
shrunk by area averaging to a small thumbnail, then

* ``"phash"`` (the default; Zauner 2010, as the ``imagehash`` package computes it): a 32 x 32
  thumbnail, its 2-D DCT-II, the 8 x 8 lowest frequencies, one bit per coefficient above
  their median;
* ``"dhash"``: a 9 x 8 thumbnail, one bit per horizontally neighbouring pair (right brighter).

Either is 64 bits (a ``uint64``), and near-identical images have hashes a few bits apart:
JPEG re-encoding (quality 40) and resizing (to 3/4) move a pHash by 0 to 2 bits, a crop of
3% a side by 2 to 6 (5% a side: 6 to 16, beyond what is still a copy), while unrelated images
lie about 32 apart (20 at the closest of 435 pairs of the test scenes). Two
images are near-duplicates when their hashes differ in at most ``max_distance`` bits
(default :data:`MAX_DISTANCE`).

**The search** is a multi-index hash (Norouzi et al. 2012), not a comparison of all pairs:
the 64 bits are cut into ``m`` bands; two hashes within ``r`` bits agree within ``r // m``
bits on at least one band (pigeonhole), so each band is sorted once and looked up, by
``searchsorted``, at every value within ``r // m`` bits of each query's band. Every pair
within ``r`` is found (no false negatives) and every candidate is verified by its full
distance (no false positives). ``m`` is chosen by a cost model (:func:`plan_bands`) for the
sizes at hand: at the default ``r = 8``, three bands of 21-22 bits, 232 lookups a band, and
about ``N^2 / 2 * 3 * 232 / 2^21`` candidates for well spread hashes (0.03% of all pairs),
so time grows as ``N log N`` plus a small share of ``N^2``; memory is that of the pairs found.

:func:`find` lists the pairs within one split or across two (``audit --against``);
:func:`findings` makes the ``"duplicates"`` section of ``diagnostics/__init__.py``. The hashes
are computed where samples are read, by the loader's workers (:class:`HashTransform`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from itertools import combinations
from typing import Any

import numpy as np

from .image_quality import grey, is_image

MAX_DISTANCE = 8  # bits: re-encoded, resized and slightly cropped copies lie within it, unrelated images far beyond
HASH_KEY = "__phash__:"  # prefix of the key HashTransform adds: HASH_KEY + "<key>"
METHODS = ("phash", "dhash")
MIN_BANDS = 3  # bands of at most 22 bits: a bucket table of 4M entries at most


# -- the hash ------------------------------------------------------------------------------------
def thumbnails(images: np.ndarray, height: int, width: int, value_range: float | None = None) -> np.ndarray:
    """Grey ``(N, height, width)`` thumbnails of a batch, by area averaging (every source pixel
    counts, in its share of each cell: no aliasing from skipped pixels)."""
    g = grey(images, value_range).astype(np.float64)
    return _shrink(_shrink(g, height, axis=1), width, axis=2)


def _shrink(a: np.ndarray, size: int, axis: int) -> np.ndarray:
    """``a`` averaged down (or stretched) to ``size`` along ``axis`` with exact area weights."""
    n = a.shape[axis]
    edges = np.arange(size + 1) * (n / size)  # cell j covers source [edges[j], edges[j+1])
    lo, hi = np.arange(n), np.arange(1, n + 1)
    overlap = np.clip(np.minimum(hi[None, :], edges[1:, None]) - np.maximum(lo[None, :], edges[:-1, None]), 0, None)
    weights = overlap / overlap.sum(axis=1, keepdims=True)  # (size, n)
    return np.moveaxis(np.tensordot(a, weights, axes=([axis], [1])), -1, axis)


def _dct_matrix(n: int) -> np.ndarray:
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.cos(np.pi * (2 * i + 1) * k / (2 * n))


_DCT32 = _dct_matrix(32)


def hashes(images: np.ndarray, method: str = "phash", value_range: float | None = None) -> np.ndarray:
    """The 64-bit perceptual hash (``uint64``) of each image of a batch ``(N, H, W[, C])``;
    one image ``(H, W[, C])`` gives an array of one."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    a = np.asarray(images)
    if a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (1, 3, 4)):
        a = a[None]
    if method == "dhash":
        t = thumbnails(a, 8, 9, value_range)
        bits = t[:, :, 1:] > t[:, :, :-1]
    else:
        t = thumbnails(a, 32, 32, value_range)
        low = (_DCT32 @ t @ _DCT32.T)[:, :8, :8].reshape(len(t), 64)
        bits = low > np.median(low, axis=1, keepdims=True)
    return _pack(bits.reshape(len(a), 64))


def _pack(bits: np.ndarray) -> np.ndarray:
    """Rows of 64 bools as uint64, the first bool the highest bit (as imagehash prints them)."""
    return np.packbits(bits, axis=1).view(">u8").reshape(-1).astype(np.uint64)


def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between hashes, element-wise."""
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64))).astype(np.int64)


class HashTransform:
    """A transform that adds each image key's hash under ``HASH_KEY + "<key>"`` (a uint64
    scalar), so the loader's workers compute it. Picklable (process workers)."""

    def __init__(self, method: str = "phash", keys: Iterable[str] | None = None, value_range: float | None = None):
        self.method, self.value_range = method, value_range
        self.keys = None if keys is None else tuple(keys)

    def __call__(self, sample: Mapping[str, Any], rng=None) -> dict:
        out = dict(sample)
        for key in self.keys if self.keys is not None else list(sample):
            if key in sample and is_image(sample[key]):
                out[f"{HASH_KEY}{key}"] = hashes(sample[key], self.method, self.value_range)[0]
        return out


def take_hashes(batch: dict) -> dict[str, np.ndarray]:
    """Remove the keys :class:`HashTransform` added from ``batch``; ``{key: hashes}``."""
    return {name[len(HASH_KEY) :]: batch.pop(name) for name in [k for k in batch if k.startswith(HASH_KEY)]}


# -- the search ----------------------------------------------------------------------------------
def bands(count: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of ``count`` bands of nearly equal width covering the 64 bits."""
    widths = [64 // count + (k < 64 % count) for k in range(count)]
    return [(sum(widths[:k]), w) for k, w in enumerate(widths)]


def _probes(width: int, flips: int) -> int:
    return sum(math.comb(width, k) for k in range(flips + 1))


def plan_bands(n_query: int, n_indexed: int, max_distance: int) -> int:
    """The number of bands that makes the search cheapest for these sizes (a cost model:
    a bucket table per band, ``probes`` lookups of every query, the candidates to verify)."""
    best, best_cost = MIN_BANDS, math.inf
    for count in range(MIN_BANDS, max(MIN_BANDS, max_distance + 1) + 1):
        layout = bands(count)
        probes = sum(_probes(w, max_distance // count) for _, w in layout)
        candidates = n_query * n_indexed * sum(_probes(w, max_distance // count) / 2**w for _, w in layout)
        cost = sum(2**w for _, w in layout) + probes * n_query + 8 * candidates  # a candidate: gathers, popcount
        if cost < best_cost:
            best, best_cost = count, cost
    return best


def _masks(bits: int, flips: int) -> np.ndarray:
    """Every ``bits``-bit value with at most ``flips`` bits set."""
    out = [0]
    for r in range(1, flips + 1):
        out += [sum(1 << i for i in chosen) for chosen in combinations(range(bits), r)]
    return np.array(out, np.uint64)


def _ranges(order: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query index, indexed index) for every indexed entry in each query's ``[lo, hi)``."""
    counts = hi - lo
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    queries = np.repeat(np.arange(len(lo)), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return queries, order[np.repeat(lo, counts) + offsets]


def find(
    a: np.ndarray, b: np.ndarray | None = None, max_distance: int = MAX_DISTANCE, *, band_count: int | None = None
) -> np.ndarray:
    """Pairs ``(i, j, distance)`` (int64 rows, sorted) of hashes within ``max_distance`` bits:
    ``i < j`` within ``a`` when ``b`` is None, else ``i`` in ``a`` and ``j`` in ``b``. Every such
    pair, each once, for any ``band_count`` (default: the cheapest, :func:`plan_bands`; see the
    module docstring for how and what it costs)."""
    a = np.asarray(a, np.uint64).reshape(-1)
    within = b is None
    b = a if within else np.asarray(b, np.uint64).reshape(-1)
    if not len(a) or not len(b) or max_distance < 0:
        return np.zeros((0, 3), np.int64)
    count = band_count or plan_bands(len(a), len(b), max_distance)
    if not MIN_BANDS <= count <= 64:
        raise ValueError(f"band_count must be {MIN_BANDS}..64, got {count}")
    found = [np.zeros((0, 3), np.int64)]
    for shift, width in bands(count):
        low = np.uint64((1 << width) - 1)
        indexed = (b >> np.uint64(shift)) & low
        order = np.argsort(indexed, kind="stable")
        # bucket table: the entries of value v are order[starts[v]:starts[v + 1]] (a counting sort)
        starts = np.concatenate([[0], np.cumsum(np.bincount(indexed.astype(np.int64), minlength=1 << width))])
        query = ((a >> np.uint64(shift)) & low).astype(np.int64)
        for mask in _masks(width, max_distance // count).astype(np.int64):
            q = query ^ mask
            i, j = _ranges(order, starts[q], starts[q + 1])
            if within:
                i, j = i[i < j], j[i < j]
            d = distance(a[i], b[j])
            close = d <= max_distance
            found.append(np.stack([i[close], j[close], d[close]], axis=1))
    pairs = np.concatenate(found)
    # a pair close on several bands is found on each: keep one, in (i, j) order (unique sorts the keys)
    _, first = np.unique(pairs[:, 0] * len(b) + pairs[:, 1], return_index=True)
    return pairs[first]


# -- findings ------------------------------------------------------------------------------------
def findings(
    ids: np.ndarray,
    pairs: np.ndarray,
    *,
    other_ids: np.ndarray | None = None,
    split_a: str | None = None,
    split_b: str | None = None,
    locate: Callable[[int], str | None] | None = None,
    locate_other: Callable[[int], str | None] | None = None,
) -> list[dict]:
    """The ``"duplicates"`` section for ``pairs`` of :func:`find`: ``{"a", "b", "distance"}``
    as sample ids (``ids[i]``, and ``other_ids[j]`` across splits), with the splits' names and
    the files when known, closest first."""
    other_ids = ids if other_ids is None else other_ids
    locate_other = locate if locate_other is None else locate_other
    out = []
    for i, j, d in pairs[np.argsort(pairs[:, 2], kind="stable")].tolist():
        entry: dict[str, Any] = {"a": int(ids[i]), "b": int(other_ids[j]), "distance": int(d)}
        if split_a is not None:
            entry["split_a"] = split_a
        if split_b is not None:
            entry["split_b"] = split_b
        for side, where in (
            ("a_file", locate and locate(entry["a"])),
            ("b_file", locate_other and locate_other(entry["b"])),
        ):
            if where:
                entry[side] = where
        out.append(entry)
    return out
