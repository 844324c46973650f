"""The Keras internals steadyfeed recognises, in one place (read in keras 3.15.1).

``PyDataset.on_epoch_begin()`` gets no arguments, yet the dataset needs to know who opened
the epoch. Keras always calls it synchronously from ``EpochIterator._enumerate_iterator``
in the thread that runs ``fit`` / ``evaluate`` / ``predict``, so the caller's stack says:

* **the model**: ``self`` of the trainer's ``fit``/``evaluate``/``predict`` frame, so the
  dataset can check its batches against ``model.inputs`` before the first step;
* **the build probe**: on a model whose layers, loss or metrics are not built yet, those
  methods first run ``Trainer._symbolic_build`` (JAX, torch; TF's ``_maybe_symbolic_build``
  under a distribution strategy). It opens an epoch, pulls one batch (TF's prefetch may
  pull a few) only to learn shapes, and closes it through ``EpochIterator.reset()``.
  Nothing is trained on it, so the dataset serves it with ``loader.peek`` (no batch used up);
* **validation inside fit**: the ``x`` of an enclosing ``fit`` frame tells whether the
  training dataset is being evaluated too, which would use up its next epoch;
* **steps_per_epoch**: with ``steps_per_epoch`` / ``validation_steps`` /
  ``keras.config.max_steps_per_epoch`` Keras carries one iterator across its epochs, so a
  Keras epoch would no longer be a steadyfeed epoch; the dataset refuses that.

If a later Keras renames these functions the probe would use up one loader batch:
``tests/test_keras_integration.py`` checks exactly-once ids under ``fit`` on every backend.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

_BUILD_FUNCTIONS = ("_symbolic_build", "_maybe_symbolic_build")
_ENTRY_POINTS = ("fit", "evaluate", "predict")
_KERAS_DIR = f"{os.sep}keras{os.sep}"


@dataclass
class KerasCall:
    """What the stack says about the Keras call that opened an epoch."""

    model: Any = None  # None when not called from a Keras trainer (e.g. by hand)
    entry: str | None = None  # "fit", "evaluate" or "predict": the innermost one
    probing: bool = False
    steps_per_epoch: int | None = None
    fit_data: Any = None  # the x of an enclosing fit (so validation can be told from training)


def _keras_frames() -> Iterator[Any]:
    frame = sys._getframe(2)
    while frame is not None:
        if _KERAS_DIR in frame.f_code.co_filename:
            yield frame
        frame = frame.f_back


def current_call() -> KerasCall:
    """Inspect the caller's stack (see the module docstring); never raises."""
    call = KerasCall()
    for frame in _keras_frames():
        name = frame.f_code.co_name
        if name == "_enumerate_iterator" and call.steps_per_epoch is None:
            call.steps_per_epoch = getattr(frame.f_locals.get("self"), "steps_per_epoch", None)
        elif name in _BUILD_FUNCTIONS:
            call.probing = True
        elif name in _ENTRY_POINTS and call.entry is None:
            call.model, call.entry = frame.f_locals.get("self"), name
        if name == "fit":
            call.fit_data = frame.f_locals.get("x")
            break
    return call
