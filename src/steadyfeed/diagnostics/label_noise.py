"""Online label-noise detection: which training samples look mislabeled, and how many are.

Because every steadyfeed batch carries its sample ids, each training sample can be followed
through training. :class:`LabelNoiseRecorder` takes, per batch, the ids, the model's outputs
for those samples (logits or probabilities) and the labels the samples were given, and keeps
per sample, summed over every time it was seen (once per epoch for an ordinary epoch):

* the **margin** of the given label: its logit minus the largest other logit. Its mean over
  epochs is the *area under the margin* (AUM, Pleiss et al., "Identifying Mislabeled Data using
  the Area Under the Margin Ranking", NeurIPS 2020). A correctly labeled sample is learned from
  its class's other samples, so its margin rises early and stays high; a mislabeled one
  contradicts its look-alikes, so its margin stays low or negative until the network memorizes
  it. Averaging over epochs keeps that early disagreement in the score;
* the cross-entropy **loss** of the given label (mean over epochs; reported, not ranked by);
* the mean **predicted probabilities**, whose argmax is the reported predicted label.

From probabilities the margin is computed on their logarithms, which equals the logit margin
(softmax's normalizer cancels in the difference). Memory: 4 bytes x (classes + 4) per sample id
up to the largest id seen (1M samples of 100 classes: ~420 MB). Cost per batch: one pass of
numpy over the ``batch x classes`` outputs (tens of microseconds for 64 x 10).

**Suspects and the noise rate.** :meth:`LabelNoiseRecorder.findings` fits a two-component
Gaussian mixture to the samples' AUMs (EM on a 256-bin histogram of them) and reads off:

* the **noise-rate estimate**: the weight of the low component (mean margin below the other's);
* the **threshold**: the AUM between the two means where a sample is as likely to belong to one
  component as to the other; samples below it are the **suspects**, ranked by AUM, lowest first
  (``score`` is the AUM: the lower, the more suspect; below 0, the given label was on average
  not the model's top class);
* the **interval**: a percentile bootstrap of the weight (the samples resampled with
  replacement, the mixture refitted, ``bootstrap`` times; on the histogram, so any dataset size
  costs the same). It covers the sampling spread of the estimate, not the model's bias.

Why a fitted split and not the paper's *threshold samples*: those re-label a random subset of
the data to an extra, fake class and train on it, which changes the training batches; this
recorder must watch an ordinary training run without changing anything. The split needs no
extra class and no second training; it assumes the AUMs of clean and of mislabeled samples form
two modes, which holds when the model learns the task better than it memorizes the noise (few
enough epochs, or regularization). When the AUMs show no low mode (the low component's mean is
not below 0, i.e. no group of samples whose given label loses on average) the estimate is the
fraction of samples with a negative AUM and the threshold is 0.

Framework-free (numpy only): a torch or JAX loop calls ``record`` itself; under Keras,
:class:`steadyfeed.keras.LabelNoiseMonitor` calls it from a callback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUTPUT_KINDS = ("auto", "logits", "probabilities")
_HISTOGRAM_BINS = 256
_EM_ITERATIONS = 300
_TINY = 1e-12
MIXTURE = "two-component Gaussian mixture of AUM"
NEGATIVE = "fraction with AUM < 0 (no low mode)"


@dataclass(frozen=True)
class NoiseOptions:
    """How :meth:`LabelNoiseRecorder.findings` turns the recorded signals into findings.

    * ``top``: suspects listed (default None: every sample below the threshold);
    * ``bootstrap``: resamples for the noise-rate interval (0: no interval, low = high = estimate);
    * ``confidence``: the interval's coverage;
    * ``seed``: the bootstrap's random seed (the findings are a function of the records and this);
    * ``min_records``: samples seen fewer times are left out (e.g. 2 to ignore samples trained
      only once by a fit cut short).
    """

    top: int | None = None
    bootstrap: int = 200
    confidence: float = 0.95
    seed: int = 0
    min_records: int = 1

    def __post_init__(self):
        if self.top is not None and self.top < 0:
            raise ValueError(f"top must be None or >= 0, got {self.top}")
        if self.bootstrap < 0 or not 0 < self.confidence < 1 or self.min_records < 1:
            raise ValueError("bootstrap must be >= 0, confidence in (0, 1) and min_records >= 1")


class LabelNoiseRecorder:
    """Per-sample training signals over epochs; see the module docstring.

    ``kind``: what ``record`` gets as outputs: ``"logits"``, ``"probabilities"`` (softmax rows,
    or one sigmoid column), or ``"auto"`` (probabilities when every row is non-negative and sums
    to 1 within 1e-3, or a single column lies in [0, 1]; logits otherwise; decided per batch).
    """

    def __init__(self, kind: str = "auto"):
        if kind not in OUTPUT_KINDS:
            raise ValueError(f"kind must be one of {OUTPUT_KINDS}, got {kind!r}")
        self.kind = kind
        self.classes = 0
        self.batches = 0
        self._margin = np.zeros(0)
        self._loss = np.zeros(0)
        self._count = np.zeros(0, np.int32)
        self._given = np.zeros(0, np.int64)
        self._changed = np.zeros(0, bool)  # a sample given different labels on different records
        self._probs = np.zeros((0, 0), np.float32)

    # -- recording ------------------------------------------------------------------------------
    def record(self, ids, outputs, labels) -> None:
        """Add one batch: ``ids`` (its sample ids), ``outputs`` (batch x classes, or batch x 1 for a
        sigmoid), ``labels`` (class indices, or one-hot / soft rows: their argmax)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        log_p = log_probabilities(np.asarray(outputs, np.float64), self.kind)
        if log_p.shape[0] != len(ids):
            raise ValueError(f"{len(ids)} ids but outputs for {log_p.shape[0]} rows")
        given = class_indices(labels, log_p.shape[1], len(ids))
        if len(ids) == 0:
            return
        if ids.min() < 0:
            raise ValueError(f"sample ids are >= 0, got {ids.min()}")
        self._grow(int(ids.max()) + 1, log_p.shape[1])
        rows = np.arange(len(ids))
        given_log_p = log_p[rows, given]
        others = log_p.copy()
        others[rows, given] = -np.inf
        margin, probabilities = given_log_p - others.max(axis=1), np.exp(log_p).astype(np.float32)
        seen = self._count[ids] > 0
        self._changed[ids] |= seen & (self._given[ids] != given)
        self._given[ids] = given
        if len(np.unique(ids)) == len(ids):  # the usual batch: each id once, plain indexed adds
            self._margin[ids] += margin
            self._loss[ids] -= given_log_p
            self._probs[ids] += probabilities
            self._count[ids] += 1
        else:  # an id twice in one batch (a weighted sampler): unbuffered adds count both
            np.add.at(self._margin, ids, margin)
            np.add.at(self._loss, ids, -given_log_p)
            np.add.at(self._probs, ids, probabilities)
            np.add.at(self._count, ids, 1)
        self.batches += 1

    def _grow(self, size: int, classes: int) -> None:
        if self.classes and classes != self.classes:
            raise ValueError(f"outputs have {classes} classes, earlier batches had {self.classes}")
        self.classes = classes
        if size <= len(self._count):
            return
        size = max(size, 2 * len(self._count))  # amortized: ids arrive in any order
        grown = size - len(self._count)
        self._margin = np.concatenate([self._margin, np.zeros(grown)])
        self._loss = np.concatenate([self._loss, np.zeros(grown)])
        self._count = np.concatenate([self._count, np.zeros(grown, np.int32)])
        self._given = np.concatenate([self._given, np.zeros(grown, np.int64)])
        self._changed = np.concatenate([self._changed, np.zeros(grown, bool)])
        self._probs = np.concatenate([self._probs.reshape(-1, classes), np.zeros((grown, classes), np.float32)])

    # -- what was recorded ------------------------------------------------------------------------
    def signals(self, min_records: int = 1) -> dict[str, np.ndarray]:
        """Per sample seen at least ``min_records`` times: ``id``, ``aum``, ``loss``, ``given``,
        ``predicted``, ``records`` (times seen), ``label_changed``; ids ascending."""
        ids = np.flatnonzero(self._count >= min_records)
        count = self._count[ids]
        return {
            "id": ids,
            "aum": self._margin[ids] / count,
            "loss": self._loss[ids] / count,
            "given": self._given[ids],
            "predicted": self._probs[ids].argmax(axis=1) if len(ids) else ids,
            "records": count,
            "label_changed": self._changed[ids],
        }

    def findings(self, options: NoiseOptions = NoiseOptions()) -> dict:
        """The ``label_noise`` section of a report (see :mod:`steadyfeed.diagnostics`): ``suspects``
        (lowest AUM first), ``noise_rate`` {estimate, low, high, confidence, method}, ``threshold``,
        ``samples``, ``max_records``, ``split`` (the fitted mixture) and ``aum_histogram``."""
        s = self.signals(options.min_records)
        n = len(s["id"])
        if n == 0:
            return {"suspects": [], "noise_rate": None, "threshold": None, "samples": 0, "max_records": 0}
        split = fit_split(s["aum"])
        low, high = bootstrap_interval(s["aum"], split, options)
        order = np.argsort(s["aum"], kind="stable")
        flagged = order[: int(np.count_nonzero(s["aum"] < split.threshold))]
        listed = flagged if options.top is None else order[: options.top]
        counts, edges = np.histogram(s["aum"], bins=40)
        return {
            "suspects": [_suspect(s, i, split.threshold) for i in listed.tolist()],
            "noise_rate": {
                "estimate": split.rate,
                "low": low,
                "high": high,
                "confidence": options.confidence,
                "method": split.method,
            },
            "threshold": split.threshold,
            "flagged": int(len(flagged)),
            "samples": n,
            "max_records": int(s["records"].max()),
            "label_changed": int(np.count_nonzero(s["label_changed"])),
            "split": split.as_dict(),
            "aum_histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        }


def _suspect(s: dict, i: int, threshold: float) -> dict:
    return {
        "id": int(s["id"][i]),
        "given": int(s["given"][i]),
        "predicted": int(s["predicted"][i]),
        "score": float(s["aum"][i]),
        "loss": float(s["loss"][i]),
        "records": int(s["records"][i]),
        "flagged": bool(s["aum"][i] < threshold),
    }


# -- outputs and labels ---------------------------------------------------------------------------
def log_probabilities(outputs: np.ndarray, kind: str = "auto") -> np.ndarray:
    """Rows of log-probabilities (batch x classes) from logits or probabilities (see the recorder);
    a single column is a binary model's, and becomes two classes."""
    if outputs.ndim == 1:
        outputs = outputs[:, None]
    if outputs.ndim != 2:
        raise ValueError(f"outputs must be batch x classes, got shape {outputs.shape}")
    probabilities = kind == "probabilities" or (kind == "auto" and _looks_like_probabilities(outputs))
    if outputs.shape[1] == 1:  # a sigmoid output: p or its logit z is class 1, 1 - p or 0 class 0
        outputs = np.concatenate([1 - outputs, outputs] if probabilities else [np.zeros_like(outputs), outputs], 1)
    if probabilities:
        return np.log(np.clip(outputs, _TINY, None))
    shifted = outputs - outputs.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _looks_like_probabilities(outputs: np.ndarray) -> bool:
    if not len(outputs) or outputs.min() < 0:
        return False
    if outputs.shape[1] == 1:
        return bool(outputs.max() <= 1)
    return bool(np.all(np.abs(outputs.sum(axis=1) - 1) < 1e-3))


def class_indices(labels, classes: int, rows: int) -> np.ndarray:
    """Class indices from labels given as indices (any shape of ``rows`` values) or as one-hot /
    soft rows (``rows x classes``: their argmax)."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == classes and classes > 1:
        labels = labels.argmax(axis=1)
    labels = labels.reshape(-1)
    if len(labels) != rows:
        raise ValueError(f"{rows} rows of outputs but {len(labels)} labels")
    if labels.dtype.kind == "f":
        labels = np.rint(labels)  # a binary model's float 0/1 labels
    labels = labels.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= max(classes, 2)):
        raise ValueError(f"labels must be class indices in [0, {max(classes, 2)}), got {labels.min()}..{labels.max()}")
    return labels


# -- the two-component split ----------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """A two-component 1-d Gaussian mixture of AUMs, and what is read off it."""

    weight: float  # of the low component
    low_mean: float
    low_sd: float
    high_mean: float
    high_sd: float
    threshold: float
    rate: float
    method: str

    def as_dict(self) -> dict:
        return {
            "weight": self.weight,
            "low_mean": self.low_mean,
            "low_sd": self.low_sd,
            "high_mean": self.high_mean,
            "high_sd": self.high_sd,
        }


def fit_split(aum: np.ndarray) -> Split:
    """The mixture of ``aum`` and the estimate, threshold and method it gives (module docstring)."""
    centers, counts = _histogram(aum)
    weight, means, sds = _em(centers, counts, _initial(aum))
    if means[0] >= 0:  # no low mode: nobody's given label loses on average
        rate = float(np.mean(aum < 0))
        return Split(weight, means[0], sds[0], means[1], sds[1], 0.0, rate, NEGATIVE)
    return Split(weight, means[0], sds[0], means[1], sds[1], _crossing(weight, means, sds), weight, MIXTURE)


def bootstrap_interval(aum: np.ndarray, split: Split, options: NoiseOptions) -> tuple[float, float]:
    """A percentile bootstrap of the noise-rate estimate: the histogram's counts resampled
    (multinomially, as resampling the samples would) and the estimate made again on each."""
    if options.bootstrap == 0:
        return split.rate, split.rate
    centers, counts = _histogram(aum)
    resampled = np.random.default_rng(options.seed).multinomial(len(aum), counts / counts.sum(), options.bootstrap)
    if split.method == MIXTURE:
        start = (split.weight, (split.low_mean, split.high_mean), (split.low_sd, split.high_sd))
        rates = _em(centers, resampled.astype(np.float64), start)[0]
    else:
        rates = resampled[:, centers < 0].sum(axis=1) / len(aum)
    tail = 100 * (1 - options.confidence) / 2
    low, high = np.percentile(rates, [tail, 100 - tail])
    return float(min(low, split.rate)), float(max(high, split.rate))


def _histogram(aum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = float(aum.min()), float(aum.max())
    if hi - lo < 1e-9:
        hi = lo + 1e-9
    counts, edges = np.histogram(aum, bins=_HISTOGRAM_BINS, range=(lo, hi))
    return (edges[:-1] + edges[1:]) / 2, counts.astype(np.float64)


def _initial(aum: np.ndarray) -> tuple:
    """Start the low component on the negative AUMs (or the lowest tenth when there are few)."""
    low = aum < 0
    if not 0.01 * len(aum) <= low.sum() <= 0.5 * len(aum):
        low = aum <= np.quantile(aum, 0.1)
    if low.all() or not low.any():
        low = np.arange(len(aum)) < max(1, len(aum) // 10)
    spread = max(float(aum.std()), 1e-3)
    return (
        float(low.mean()),
        (float(aum[low].mean()), float(aum[~low].mean())),
        (max(float(aum[low].std()), spread / 10), max(float(aum[~low].std()), spread / 10)),
    )


def _em(x: np.ndarray, weights: np.ndarray, start: tuple) -> tuple:
    """EM for two 1-d Gaussians on the points ``x`` weighted by ``weights`` (one row of weights,
    or several: then each row is fitted at once, vectorized, and every result is an array);
    component 0 is the one of lower mean."""
    rows = np.atleast_2d(weights)
    k = len(rows)
    pi = np.full(k, float(start[0]))
    means = np.tile(np.asarray(start[1], float), (k, 1))
    sds = np.tile(np.asarray(start[2], float), (k, 1))
    floor = max(float(np.ptp(x)), 1e-6) / _HISTOGRAM_BINS  # a component never collapses below one bin
    total = rows.sum(axis=1)
    for _ in range(_EM_ITERATIONS):
        dens = np.stack(
            [
                pi[:, None] * _normal(x, means[:, :1], sds[:, :1]),
                (1 - pi)[:, None] * _normal(x, means[:, 1:], sds[:, 1:]),
            ],
            axis=1,
        )  # k x 2 x bins
        resp = dens / np.maximum(dens.sum(axis=1, keepdims=True), _TINY)
        mass = np.maximum((resp * rows[:, None]).sum(axis=2), _TINY)  # k x 2
        new_means = (resp * rows[:, None] * x).sum(axis=2) / mass
        sds = np.maximum(np.sqrt((resp * rows[:, None] * (x - new_means[:, :, None]) ** 2).sum(axis=2) / mass), floor)
        new_pi = mass[:, 0] / total
        converged = np.all(np.abs(new_pi - pi) < 1e-6) and np.allclose(new_means, means, atol=1e-6)
        pi, means = new_pi, new_means
        if converged:
            break
    swap = means[:, 0] > means[:, 1]
    pi = np.where(swap, 1 - pi, pi)
    means = np.where(swap[:, None], means[:, ::-1], means)
    sds = np.where(swap[:, None], sds[:, ::-1], sds)
    if np.ndim(weights) == 1:
        return float(pi[0]), tuple(float(m) for m in means[0]), tuple(float(v) for v in sds[0])
    return pi, means, sds


def _normal(x: np.ndarray, mean: float | np.ndarray, sd: float | np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))


def _crossing(weight: float, means: tuple, sds: tuple) -> float:
    """The AUM between the means where both components are equally likely."""
    grid = np.linspace(means[0], means[1], 2001)
    low = weight * _normal(grid, means[0], sds[0])
    high = (1 - weight) * _normal(grid, means[1], sds[1])
    above = np.flatnonzero(high >= low)
    return float(grid[above[0]] if len(above) else means[1])
