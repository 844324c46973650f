"""Data-quality checks: per sample (non-finite values, constant arrays, unexpected shapes) and
per dataset (shape outliers, label distribution drift).

Per-sample checks are functions ``check(array) -> str | None`` (a description of what is
wrong, or None), registered by name in :data:`CHECKS`:

* ``"finite"``: a float or complex array holds no NaN and no Inf (other dtypes pass);
* ``"not_constant"``: a numeric array of two or more values does not hold one value
  everywhere (std == 0: a blank or constant image, a dead sensor). Scalars pass.

They run in three places: :class:`Checked` (a source wrapper, so a bad sample raises a
:class:`~steadyfeed.DataError` and the Loader raises it, or quarantines it under
``on_error="skip"``), ``steadyfeed audit --checks`` and ``steadyfeed inspect --checks``.

Image checks (``"blur"``, ``"underexposed"``, ``"overexposed"``, ``"low_contrast"``;
``"image"`` names all four) judge a score against a threshold drawn from the dataset's own
statistics (``diagnostics/image_quality.py``), so they are not in :data:`CHECKS`: the same
three places compute their scores and thresholds there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .diagnostics import image_quality
from .errors import DataError
from .sources.base import locate
from .sources.wrapper import SourceWrapper

DRIFT_THRESHOLD = 0.1  # total variation distance above which two label distributions are said to drift


def finite(a: np.ndarray) -> str | None:
    if a.dtype.kind not in "fc":
        return None
    nan = int(np.count_nonzero(np.isnan(a)))
    inf = int(np.count_nonzero(np.isinf(a)))
    return f"{nan} NaN and {inf} Inf of {a.size} values" if nan or inf else None


def not_constant(a: np.ndarray) -> str | None:
    if a.size < 2 or a.dtype.kind not in "biufc":
        return None
    first = a.flat[0]
    return f"all {a.size} values are {first.item()!r}" if bool(np.all(a == first)) else None


CHECKS: dict[str, Callable[[np.ndarray], str | None]] = {"finite": finite, "not_constant": not_constant}


def check_names(names: Iterable[str] | str) -> tuple[str, ...]:
    """Validated check names; ``"all"`` means every per-sample check (:data:`CHECKS`),
    ``"image"`` every image check; a string may be comma-separated."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    expanded: list[str] = []
    for name in names:
        expanded += CHECKS if name == "all" else image_quality.CHECKS if name == "image" else [name]
    unknown = [n for n in expanded if n not in CHECKS and n not in image_quality.CHECKS]
    if unknown:
        raise ValueError(
            f"unknown check(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join([*CHECKS, *image_quality.CHECKS])}, all, image"
        )
    return tuple(dict.fromkeys(expanded))


def image_checks(names: Sequence[str]) -> tuple[str, ...]:
    """The image checks among ``names`` (they need thresholds, ``diagnostics/image_quality.py``)."""
    return tuple(n for n in names if n in image_quality.CHECKS)


@dataclass(frozen=True)
class Problem:
    """One failed check: which sample, which key, which check, what was found."""

    sample_id: Any  # an id, or a file path for files
    key: str
    check: str
    detail: str

    def __str__(self) -> str:
        what = f"sample {self.sample_id}" if isinstance(self.sample_id, (int, np.integer)) else str(self.sample_id)
        return f"{what}, key {self.key!r}: {self.check}: {self.detail}"

    def as_dict(self) -> dict:
        return {"sample_id": _plain(self.sample_id), "key": self.key, "check": self.check, "detail": self.detail}


def sample_problems(
    sample_id: Any, sample: Mapping[str, Any], checks: Sequence[str], keys: Iterable[str] | None = None
) -> list[Problem]:
    """Every failed per-sample check of one sample, over ``keys`` (default: all of its keys);
    image checks, which need thresholds, are left to :func:`image_problems`."""
    found = []
    for key in sample if keys is None else keys:
        if key in sample:
            a = np.asarray(sample[key])
            found += [
                Problem(sample_id, key, name, detail)
                for name in checks
                if name in CHECKS and (detail := CHECKS[name](a)) is not None
            ]
    return found


def image_problems(
    sample_id: Any,
    sample: Mapping[str, Any],
    limits: Mapping[str, float],
    keys: Iterable[str] | None = None,
    value_range: float | None = None,
) -> list[Problem]:
    """Every image check of ``limits`` (check -> threshold) that an image key of the sample fails."""
    found = []
    for key in sample if keys is None else keys:
        if key in sample and image_quality.is_image(sample[key]):
            scores = image_quality.scores(sample[key], value_range)
            found += [
                Problem(sample_id, key, name, image_quality.problem(name, float(scores[name][0]), limit))
                for name, limit in limits.items()
                if image_quality.flagged(name, scores[name], limit)[0]
            ]
    return found


class Checked(SourceWrapper):
    """A source whose samples must pass ``checks`` (names in :data:`CHECKS`, and image checks)
    on ``keys`` (default: every key) and, per key in ``shapes``, have exactly that shape.

    Image checks (``"blur"``, ``"underexposed"``, ``"overexposed"``, ``"low_contrast"``, or
    ``"image"`` for all) flag an image whose score lies beyond its threshold: ``thresholds``
    (check -> value) where given, else calibrated once, when the wrapper is built, from up
    to ``calibrate`` evenly spaced samples (a deterministic subsample read here, in the
    consumer: its cost is that many reads; ``checked.thresholds`` holds the result), so
    every worker and every run judges by the same thresholds. Scores are computed by the
    workers, on the sample arrays (``diagnostics/image_quality.py``).

    ``Checked(source)[i]`` is ``source[i]`` unchanged, or raises :class:`DataError` naming the
    sample (and where it lives), the key, the check and what was found, so the Loader
    raises a ``SampleError`` for it, or quarantines it under ``on_error="skip"``::

        Loader(Checked(source, checks=("finite", "not_constant")), 64, on_error="skip")

    ``len``, ``read_many``, ``locate``, ``fingerprint`` and ``close`` go to the wrapped
    source (``sources/wrapper.py``); a batch read whose samples fail is redone sample by
    sample by the Loader, so the failure is pinned on its own id. Picklable when the source is.
    """

    def __init__(
        self,
        source: Any,
        checks: Iterable[str] | str = ("finite", "not_constant"),
        *,
        keys: Iterable[str] | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        thresholds: Mapping[str, float] | None = None,
        calibrate: int = 1000,
        value_range: float | None = None,
    ) -> None:
        super().__init__(source)
        self.checks = check_names(checks)
        self.keys = None if keys is None else tuple(keys)
        self.shapes = {key: tuple(int(d) for d in shape) for key, shape in (shapes or {}).items()}
        self.value_range = value_range
        wanted = image_checks(self.checks)
        self.thresholds = (
            image_quality.calibrate(
                source, wanted, self.keys, samples=calibrate, given=thresholds, value_range=value_range
            )
            if wanted
            else {}
        )

    def wrap_sample(self, i: int, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        problems = sample_problems(i, sample, self.checks, self.keys)
        if self.thresholds:
            problems += image_problems(i, sample, self.thresholds, self.keys, self.value_range)
        problems += [
            Problem(i, key, "shape", f"expected shape {shape}, found {np.shape(sample[key])}")
            for key, shape in self.shapes.items()
            if np.shape(sample[key]) != shape
        ]
        if problems:
            where = locate(self.source, i)
            raise DataError(
                f"{problems[0]}{f' ({where})' if where else ''}"
                + (f"; and {len(problems) - 1} more" if len(problems) > 1 else "")
            )
        return sample

    def _repr_options(self) -> str:
        return f", checks={self.checks}" + (f", shapes={self.shapes}" if self.shapes else "")


# -- per dataset ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outliers:
    """The most common value of a property (a shape, an image mode), how many items have it,
    and the items that do not."""

    common: Any  # hashable: a shape, an image mode, ...
    common_count: int
    items: list

    def as_dict(self, limit: int | None = None) -> dict:
        """JSON-ready; ``limit`` caps the items listed (``count`` stays complete)."""
        return {
            "common": _plain(self.common),
            "common_count": self.common_count,
            "count": len(self.items),
            "items": [_plain(i) for i in self.items[:limit]],
        }


def outliers(values: Mapping[Any, Hashable]) -> Outliers | None:
    """Items whose value differs from the most common value (ties: the first seen); None when empty."""
    if not values:
        return None
    common, count = Counter(values.values()).most_common(1)[0]
    return Outliers(common, count, [item for item, value in values.items() if value != common])


def label_classes(labels: Any) -> list | None:
    """The class of each row of ``labels``: integer, bool or string scalars as they are (also
    as a column, shape ``(N, 1)``, as Keras often holds them), one-hot rows as the index of
    their 1; None when the labels are not categorical (floats, other shapes)."""
    a = np.asarray(labels)
    if a.ndim == 2 and a.shape[1] == 1 and a.dtype.kind in "biuUS":
        a = a[:, 0]
    if a.ndim == 1 and a.dtype.kind in "biuUS":
        return [_plain(v) for v in a.tolist()]
    if a.ndim == 2 and a.dtype.kind in "biuf" and a.shape[1] > 1:
        one_hot = np.all((a == 0) | (a == 1), axis=1) & (np.count_nonzero(a, axis=1) == 1)
        if bool(one_hot.all()):
            return np.argmax(a, axis=1).tolist()
    return None


def total_variation(a: Mapping[Hashable, int], b: Mapping[Hashable, int]) -> float:
    """Half the L1 distance between two histograms as distributions: 0 when identical, 1 when disjoint."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0 if na == nb else 1.0
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in set(a) | set(b))


def _plain(v: Any) -> Any:
    """A JSON-friendly value: numpy scalars as Python ones, bytes as text, tuples as lists."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v
