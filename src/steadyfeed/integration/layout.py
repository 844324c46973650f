"""Which batch keys feed which part of a Keras step: ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``.

Framework-free, shared by the Keras dataset and the ``tf.data`` bridge so both give a
model exactly the same structure.

``x`` and ``y`` each name one batch key (``"x"``), a tuple of keys (``("a", "b")``,
positional model inputs or outputs), or a dict ``{model input name: batch key}``
(multi-input models). Under ``last_batch="pad"`` the batch's float32 ``"mask"`` becomes
the sample weight (multiplied into ``sample_weight`` when that names a key too), so padded
rows weigh nothing in the loss and the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError

KeySpec = str | tuple | dict | None


def _normalize(spec: Any, role: str) -> KeySpec:
    if spec is None or isinstance(spec, str):
        return spec
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(k, str) for k in spec):
        return tuple(spec)
    if isinstance(spec, Mapping) and spec and all(isinstance(k, str) and isinstance(v, str) for k, v in spec.items()):
        return dict(spec)
    raise TypeError(
        f"{role} must name a batch key, a tuple of keys or a dict {{model input name: batch key}}, got {spec!r}"
    )


def _keys_of(spec: KeySpec) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    return list(spec.values()) if isinstance(spec, dict) else list(spec)


def _get(batch: Mapping[str, np.ndarray], key: str, role: str) -> np.ndarray:
    try:
        return batch[key]
    except KeyError:
        raise DataError(f"{role} names batch key {key!r}, but the loader's batches have keys {sorted(batch)}") from None


def _pick(batch: Mapping[str, np.ndarray], spec: KeySpec, role: str):
    if isinstance(spec, str):
        return _get(batch, spec, role)
    if isinstance(spec, dict):
        return {name: _get(batch, key, role) for name, key in spec.items()}
    assert spec is not None  # callers pick x (never None) and a y that is not None
    return tuple(_get(batch, key, role) for key in spec)


@dataclass(frozen=True)
class BatchLayout:
    """How one steadyfeed batch (a dict of arrays) becomes what a Keras step takes."""

    x: KeySpec = "x"
    y: KeySpec = "y"
    sample_weight: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "x", _normalize(self.x, "x"))
        object.__setattr__(self, "y", _normalize(self.y, "y"))
        if self.x is None:
            raise TypeError("x must name at least one batch key")
        if self.sample_weight is not None and not isinstance(self.sample_weight, str):
            raise TypeError(f"sample_weight must name one batch key, got {self.sample_weight!r}")

    def to_keras(self, batch: Mapping[str, np.ndarray]) -> tuple | dict:
        """``(x,)`` when there is no ``y`` (predict), else ``(x, y)`` or ``(x, y, weights)``;
        a dict ``x`` without ``y`` is the batch itself (Keras reads a dict batch as the inputs)."""
        x = _pick(batch, self.x, "x")
        if self.y is None:
            return x if isinstance(x, dict) else (x,)
        y = _pick(batch, self.y, "y")
        weights = self.weights(batch)
        return (x, y) if weights is None else (x, y, weights)

    def weights(self, batch: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """The named sample weights times the pad mask, whichever of the two exist."""
        given = None if self.sample_weight is None else _get(batch, self.sample_weight, "sample_weight")
        mask = batch.get("mask")
        if mask is None:
            return given
        if given is None:
            return mask
        given = np.asarray(given, dtype=np.float32)
        return given * mask.reshape(mask.shape + (1,) * (given.ndim - 1))

    def x_keys(self) -> list[tuple[str, int | str]]:
        """``[(batch key, model input position or name)]``, in the order x lists them."""
        if isinstance(self.x, str):
            return [(self.x, 0)]
        if isinstance(self.x, dict):
            return [(key, name) for name, key in self.x.items()]
        assert self.x is not None  # refused by __post_init__
        return [(key, i) for i, key in enumerate(self.x)]

    def keys(self) -> list[str]:
        """Every batch key this layout reads (besides ``"mask"``)."""
        extra = [self.sample_weight] if self.sample_weight else []
        return _keys_of(self.x) + _keys_of(self.y) + extra
