"""Image quality: blur, exposure and contrast, judged against the data's own statistics.

Four scores per image (numpy only, vectorised over a batch of images), on the grey image
``g`` scaled to [0, 1] (integer dtypes by their maximum, floats taken as already in [0, 1];
or ``value_range=``); RGB(A) is made grey with the Rec. 601 weights, alpha ignored:

* ``blur``: the variance of the 4-neighbour Laplacian of ``g`` (Pech-Pacheco et al. 2000):
  sharp edges give a large variance, a blurred image a small one. Low is bad.
* ``underexposed`` / ``overexposed``: the fraction of pixels clipped at black (``g <= 4/255``)
  or at white (``g >= 251/255``). High is bad.
* ``low_contrast``: the RMS contrast, the standard deviation of ``g``. Low is bad.

An array is an image when it has two dimensions, or three with 1, 3 or 4 channels last, and
is at least 3 x 3 pixels of a numeric dtype; other keys are not scored.

**Thresholds** come from the data unless given: robust outliers, ``median -/+ k * 1.4826 *
MAD`` of the scores (``k = 3.5``; blur on a log scale, where it is roughly symmetric), so one
odd image in a thousand cannot move them, as one would a mean and a standard deviation. For
a clipped fraction the threshold is never below ``MIN_CLIPPED`` (a fifth of the image): a
dataset of well exposed images has a MAD of 0, where any clipped pixel would be an outlier.
A threshold is strict: an image is flagged when its score lies beyond it.

The scores are computed where samples are read: in the workers of ``steadyfeed audit`` and
``inspect`` (as :class:`ScoreTransform`), and in :class:`~steadyfeed.Checked`, whose workers
raise for an image past a threshold (``Checked`` calibrates the thresholds it is not given on
a deterministic subsample, once, when it is built). :func:`findings` makes the ``"quality"``
section of ``diagnostics/__init__.py``, with a per-class breakdown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

K = 3.5  # robust z-score beyond which an image is an outlier (Iglewicz and Hoaglin's 3.5)
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
MIN_CLIPPED = 0.2  # a clipped fraction is flagged above this at least
BLACK, WHITE = 4 / 255, 251 / 255  # clipped at black at or below, at white at or above
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # Rec. 601
SCORE_KEY = "__quality__:"  # prefix of the keys ScoreTransform adds: SCORE_KEY + "<key>:<check>"


@dataclass(frozen=True)
class Measure:
    """How a check's scores are judged: which side is bad, and on which scale outliers are found."""

    low_is_bad: bool
    log_scale: bool = False
    floor: float | None = None  # a high-is-bad threshold is at least this

    def describe(self, score: float, threshold: float) -> str:
        return f"score {score:.4g} {'<' if self.low_is_bad else '>'} threshold {threshold:.4g}"


CHECKS: dict[str, Measure] = {
    "blur": Measure(low_is_bad=True, log_scale=True),
    "underexposed": Measure(low_is_bad=False, floor=MIN_CLIPPED),
    "overexposed": Measure(low_is_bad=False, floor=MIN_CLIPPED),
    "low_contrast": Measure(low_is_bad=True),
}


# -- scores ------------------------------------------------------------------------------------
def is_image(a: Any) -> bool:
    """Whether an array is an image this module scores (see the module docstring)."""
    a = np.asarray(a)
    if a.dtype.kind not in "biuf" or a.ndim not in (2, 3):
        return False
    return (a.ndim == 2 or a.shape[-1] in (1, 3, 4)) and a.shape[0] >= 3 and a.shape[1] >= 3


def grey(images: np.ndarray, value_range: float | None = None) -> np.ndarray:
    """A batch of images ``(N, H, W[, C])`` as float32 grey ``(N, H, W)`` in [0, 1]."""
    a = np.asarray(images)
    scale = value_range or (np.iinfo(a.dtype).max if a.dtype.kind in "iu" else 1.0)
    if a.ndim == 4 and a.shape[-1] == 1:
        a = a[..., 0]
    elif a.ndim == 4:
        # elementwise, not tensordot: BLAS blocks by size, so an image would not score alike
        # alone and in a batch
        rgb = a[..., :3].astype(np.float32)
        a = rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]
    return np.clip(a.astype(np.float32) / np.float32(scale), 0.0, 1.0)


def scores(images: np.ndarray, value_range: float | None = None) -> dict[str, np.ndarray]:
    """Every check's score (float64, one per image) of a batch ``(N, H, W, C)`` (or grey
    ``(N, H, W)`` with ``W > 4``); one image ``(H, W[, C])`` gives arrays of one."""
    a = np.asarray(images)
    if a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (1, 3, 4)):
        a = a[None]
    g = grey(a, value_range)
    laplacian = g[:, :-2, 1:-1] + g[:, 2:, 1:-1] + g[:, 1:-1, :-2] + g[:, 1:-1, 2:] - 4 * g[:, 1:-1, 1:-1]
    # float64 before reducing: a reduction that casts as it goes is buffered in chunks that
    # need not follow the rows, while each contiguous row of a float64 array is summed alike
    # alone and in a batch
    pixels = g.reshape(len(g), -1).astype(np.float64)
    return {
        "blur": laplacian.reshape(len(g), -1).astype(np.float64).var(axis=1),
        "underexposed": (pixels <= BLACK).mean(axis=1, dtype=np.float64),
        "overexposed": (pixels >= WHITE).mean(axis=1, dtype=np.float64),
        "low_contrast": pixels.std(axis=1, dtype=np.float64),
    }


class ScoreTransform:
    """A transform that adds each image key's scores to the sample, as float64 scalars under
    ``SCORE_KEY + "<key>:<check>"``: the scores are then computed by the loader's workers.
    Picklable (process workers)."""

    def __init__(self, checks: Sequence[str], value_range: float | None = None, keys: Iterable[str] | None = None):
        self.checks, self.value_range = tuple(checks), value_range
        self.keys = None if keys is None else tuple(keys)

    def __call__(self, sample: Mapping[str, Any], rng=None) -> dict:
        out = dict(sample)
        for key in self.keys if self.keys is not None else list(sample):
            if key in sample and is_image(sample[key]):
                found = scores(sample[key], self.value_range)
                out.update({f"{SCORE_KEY}{key}:{name}": np.float64(found[name][0]) for name in self.checks})
        return out


def take_scores(batch: dict) -> dict[tuple[str, str], np.ndarray]:
    """Remove the keys :class:`ScoreTransform` added from ``batch``; ``{(key, check): scores}``."""
    taken = {}
    for name in [k for k in batch if k.startswith(SCORE_KEY)]:
        key, _, check = name[len(SCORE_KEY) :].rpartition(":")
        taken[(key, check)] = batch.pop(name)
    return taken


# -- thresholds ------------------------------------------------------------------------------------
def robust_threshold(check: str, values: np.ndarray, k: float = K) -> float:
    """``median -/+ k * 1.4826 * MAD`` of ``values`` (NaN left out), on the check's scale."""
    measure = CHECKS[check]
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan")
    if measure.log_scale:
        v = np.log(v + 1e-12)
    median = float(np.median(v))
    spread = k * MAD_TO_SIGMA * float(np.median(np.abs(v - median)))
    threshold = median - spread if measure.low_is_bad else median + spread
    if measure.log_scale:
        threshold = float(np.exp(threshold) - 1e-12)
    return max(threshold, measure.floor) if measure.floor is not None else threshold


def thresholds(
    all_scores: Mapping[str, np.ndarray], given: Mapping[str, float] | None = None, k: float = K
) -> dict[str, float]:
    """A threshold per check of ``all_scores``: the ``given`` one, else the robust one."""
    given = dict(given or {})
    return {
        name: float(given[name]) if name in given else robust_threshold(name, values, k)
        for name, values in all_scores.items()
    }


def flagged(check: str, values: np.ndarray, threshold: float) -> np.ndarray:
    """A bool per value: beyond the threshold (strictly; NaN, an unscored sample, never)."""
    values = np.asarray(values, np.float64)
    with np.errstate(invalid="ignore"):
        return values < threshold if CHECKS[check].low_is_bad else values > threshold


def problem(check: str, score: float, threshold: float) -> str:
    """What a flagged image's failure says."""
    return CHECKS[check].describe(score, threshold)


# -- findings --------------------------------------------------------------------------------------
def findings(
    ids: np.ndarray,
    all_scores: Mapping[str, np.ndarray],
    *,
    labels: Sequence | None = None,
    locate: Callable[[int], str | None] | None = None,
    given: Mapping[str, float] | None = None,
    k: float = K,
    key: str | None = None,
) -> dict:
    """The ``"quality"`` section: per check its threshold (``"given"`` or ``"robust"``), the
    scores' median and the flagged images (worst first), and per class how many each check
    flagged. ``all_scores[check][j]`` is the score of ``ids[j]`` (NaN: not an image), ``labels[j]``
    its class; ``locate(id)`` names a flagged image's file."""
    ids = np.asarray(ids, np.int64)
    limits = thresholds(all_scores, given, k)
    checks: dict[str, dict] = {}
    per_class: dict[Any, dict[str, int]] = {}
    for name, values in all_scores.items():
        values = np.asarray(values, np.float64)
        bad = np.flatnonzero(flagged(name, values, limits[name]))
        bad = bad[np.argsort(values[bad] if CHECKS[name].low_is_bad else -values[bad], kind="stable")]
        entries = []
        for j in bad.tolist():
            entry: dict[str, Any] = {"id": int(ids[j]), "score": float(values[j])}
            if labels is not None:
                entry["label"] = _plain(labels[j])
                per_class.setdefault(entry["label"], dict.fromkeys(all_scores, 0))[name] += 1
            where = locate(int(ids[j])) if locate is not None else None
            if where:
                entry["file"] = where
            entries.append(entry)
        scored = values[np.isfinite(values)]
        checks[name] = {
            "threshold": limits[name],
            "source": "given" if name in (given or {}) else "robust",
            "direction": "low" if CHECKS[name].low_is_bad else "high",
            "scored": int(len(scored)),
            "median": float(np.median(scored)) if len(scored) else None,
            "flagged": entries,
        }
        if key is not None:
            checks[name]["key"] = key
    out = {"checks": checks}
    if labels is not None:
        out["per_class"] = {
            str(label): counts for label, counts in sorted(per_class.items(), key=lambda kv: str(kv[0]))
        }
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v


def calibrate(
    source: Any,
    checks: Sequence[str],
    keys: Iterable[str] | None = None,
    *,
    samples: int = 1000,
    value_range: float | None = None,
    given: Mapping[str, float] | None = None,
    k: float = K,
) -> dict[str, float]:
    """Thresholds from up to ``samples`` evenly spaced samples of ``source`` (ids
    ``round(j * N / samples)``: deterministic), for the checks not ``given``. Samples that
    fail to read are passed over (the loader names them when it reads them)."""
    given = {name: float(v) for name, v in (given or {}).items() if name in checks}
    missing = [c for c in checks if c not in given]
    n = len(source)
    if not missing or not n:
        return {**given, **{c: float("nan") for c in missing}}
    picks = np.unique(np.linspace(0, n - 1, min(samples, n)).round().astype(np.int64))
    found: dict[str, list[float]] = {c: [] for c in missing}
    transform = ScoreTransform(missing, value_range, keys)
    for i in picks.tolist():
        try:
            sample = transform(source[i])
        except Exception:  # an unreadable sample says nothing about the thresholds
            continue
        for (_key, check), value in take_scores(sample).items():
            found[check].append(float(value))
    return {**given, **thresholds({c: np.array(v) for c, v in found.items()}, k=k)}
