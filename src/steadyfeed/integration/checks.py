"""A batch against a model's inputs, before training: errors that say exactly what does not fit.

Keras's own error for a mismatched input surfaces deep inside a layer ("expected axis -1
of input shape to have value 4") without naming the batch key. These checks name the
batch key, the model input and both shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .layout import BatchLayout

# which numpy dtype kinds a model input of a given kind accepts without losing meaning
_ACCEPTS = {"f": "fiub", "c": "fiubc", "i": "iub", "u": "iub", "b": "b"}


class InputMismatch(ValueError):
    """A batch does not fit the model's inputs; the message names key, input and shapes."""


def model_inputs(model: Any) -> list | None:
    """The model's symbolic inputs (name, shape, dtype), or None when it does not declare any
    (an unbuilt Sequential or a subclassed model): then there is nothing to check against."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if isinstance(inputs, Mapping):
        inputs = list(inputs.values())
    return list(inputs) if inputs else None


def check_batch(batch: Mapping[str, np.ndarray], layout: BatchLayout, model: Any) -> None:
    """Raise :class:`InputMismatch` (or ``DataError`` for a key the batches lack) when
    ``batch`` arranged by ``layout`` cannot feed ``model``; return quietly otherwise."""
    layout.to_keras(batch)  # every named key exists (DataError names the missing one)
    inputs = model_inputs(model)
    if inputs is None:
        return
    for key, tensor in _pair(layout, inputs):
        _check_one(key, batch[key], tensor)


def _pair(layout: BatchLayout, inputs: list) -> list[tuple[str, Any]]:
    pairs = layout.x_keys()
    if isinstance(layout.x, dict):
        by_name = {t.name: t for t in inputs}
        unknown = [name for _, name in pairs if name not in by_name]
        if unknown:
            raise InputMismatch(f"x maps model input(s) {unknown} but the model's inputs are {sorted(by_name)}")
        unfed = sorted(set(by_name) - {name for _, name in pairs})
        if unfed:
            raise InputMismatch(f"model input(s) {unfed} get no data: x maps only {sorted(layout.x)}")
        return [(key, by_name[name]) for key, name in pairs]
    if len(pairs) != len(inputs):
        names = [t.name for t in inputs]
        raise InputMismatch(
            f"x gives {len(pairs)} array(s) {[k for k, _ in pairs]} but the model has "
            f"{len(inputs)} input(s) {names}; pass x as a tuple or a dict {{input name: batch key}}"
        )
    return [(key, inputs[int(i)]) for key, i in pairs]  # positions: x is a key or a tuple here


def _check_one(key: str, array: np.ndarray, tensor: Any) -> None:
    expected = tuple(tensor.shape)
    got = tuple(array.shape)
    fits = len(got) == len(expected) and all(e is None or e == g for e, g in zip(expected, got))
    if not fits:
        raise InputMismatch(
            f"batch key {key!r} has shape {got} (per sample {got[1:]}) but model input "
            f"{tensor.name!r} expects {expected} (per sample {expected[1:]})"
        )
    try:
        want = np.dtype(tensor.dtype).kind
    except TypeError:  # e.g. a string input: nothing numeric to compare
        return
    if array.dtype.kind not in _ACCEPTS.get(want, array.dtype.kind):
        raise InputMismatch(
            f"batch key {key!r} has dtype {array.dtype} but model input {tensor.name!r} expects {tensor.dtype}"
        )
