"""``LabelNoiseMonitor``: label-noise signals recorded during an ordinary ``model.fit``.

    train = sf.Loader(source, 64, shuffle=True, with_ids=True, workers=2)
    monitor = LabelNoiseMonitor(train)
    model.fit(train.as_keras(), epochs=10, callbacks=[monitor])
    findings = monitor.findings()          # {"suspects": [...], "noise_rate": {...}, ...}

What it does, per trained step: it takes the batches Keras trained from the dataset's own queue
of taken batches (``KerasDataset.follow``: the same arrays, in the order Keras took them, so the
ids are exactly those of the trained rows, also under ``tf.data`` prefetch and
``steps_per_execution``) when the next step begins (and the last ones at the epoch's end), runs the model on the batch's inputs once more
(``model.predict_on_batch``: inference mode, no dropout, no state or random draw of training;
``every`` trained batches at a time, in one call), and hands ids, outputs and given labels to a
:class:`~steadyfeed.diagnostics.label_noise.LabelNoiseRecorder`. Pad rows are left out.

**What it does not change**: the batches, their order and their contents (it only reads the
arrays Keras was given; the loader's plan is a function of seed and epoch alone), and the
training itself: the weights after ``fit`` are bit-identical with and without it
(``tests/test_keras_label_noise.py``, on every backend).

**Cost**: one inference forward pass over every trained row, after its step (so the outputs are
those of weights updated on that row's batch: a sample's margin is measured 1 to ``every``
steps after it was trained on, where the paper takes the training pass's own; over epochs the
ranking is the same idea). A forward pass is about a third of a training step (no backward
pass, no optimizer update), plus Keras's fixed cost per ``predict_on_batch`` call, paid once per
``every`` batches; ``seconds`` holds the time the callback took, measured. It has no
``on_train_batch_end``, which would make Keras wait for each step's logs (Keras dispatches
batch-end callbacks asynchronously only when none defines one).

Where a Keras epoch is not one pass (Keras's own ``fit(steps_per_epoch=)``, or
``stop_training``) on TensorFlow, batches ``tf.data`` prefetched but not yet trained are recorded
at the epoch's end, with those weights, one epoch early; every batch is still recorded once.
``docs/benchmarks.md`` (``bench_quality.py``) gives the measured share of a fit's time.

Wrapping ``train_step`` to take the outputs of the training forward pass itself would cost
nothing extra, but needs a different, backend-specific override of Keras's step on each
backend; the extra forward pass works with any model and any backend through public calls.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import keras
import numpy as np

from ..diagnostics.label_noise import LabelNoiseRecorder, NoiseOptions
from .callbacks import _LoaderCallback

DEFAULT_EVERY = 8


class LabelNoiseMonitor(_LoaderCallback):
    """Records per-sample margins and losses of the training samples (see the module docstring).

    ``data``: the training Loader (built with ``with_ids=True``) or its KerasDataset.
    ``label``: the batch key of the given labels (default: the dataset's ``y``, when one key).
    ``output``: which model output is the classifier's, for a model of several (index or name).
    ``kind``: what the model outputs: ``"logits"``, ``"probabilities"`` or ``"auto"``.
    ``recorder``: a :class:`LabelNoiseRecorder` to add to (e.g. one kept across fits).
    ``every``: trained batches per forward pass (their rows in one ``predict_on_batch``; also at
    each epoch's end). Keras's fixed cost per call is then paid once per ``every`` batches; a
    sample's outputs come from the weights at most ``every`` steps after it was trained on.
    Holds up to ``every`` batches (references to the arrays Keras was given) until then.
    """

    def __init__(
        self,
        data: Any,
        *,
        label: str | None = None,
        output: int | str | None = None,
        kind: str = "auto",
        recorder: LabelNoiseRecorder | None = None,
        every: int = DEFAULT_EVERY,
    ) -> None:
        super().__init__(data)
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self.every = every
        self._pending: list[dict] = []
        if not self.loader.config.read.with_ids:
            raise ValueError(
                "LabelNoiseMonitor follows samples by their ids: build the training Loader with "
                "with_ids=True (the ids are not given to the model)"
            )
        self.label = label
        self.output = output
        self.recorder = recorder if recorder is not None else LabelNoiseRecorder(kind)
        self.seconds = 0.0  # spent in this callback: the forward passes and the recording
        self._queue: deque | None = None
        self._trained_steps = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        dataset = self._dataset()
        self._layout = dataset.layout
        self._label = self.label or self._layout.y
        if not isinstance(self._label, str):
            raise ValueError(
                f"the dataset's y is {self._layout.y!r}: name the batch key of the labels, "
                "LabelNoiseMonitor(loader, label='...')"
            )
        self._queue = dataset.follow()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self._trained_steps = 0

    # No on_train_batch_end: a callback that has one makes Keras wait for every step's logs
    # (it turns off Keras's asynchronous batch-end dispatch). When step ``batch`` begins, the
    # batches of the steps before it are trained: those are taken from the queue then.
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        t0 = time.perf_counter()
        self._take(batch - self._trained_steps)
        self._trained_steps = batch
        if len(self._pending) >= self.every:
            self._flush()
        self.seconds += time.perf_counter() - t0

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # the epoch's last steps are trained now: everything Keras took for this pass is
        t0 = time.perf_counter()
        self._take(len(self._queue or ()))
        self._flush()
        self.seconds += time.perf_counter() - t0

    def on_train_end(self, logs: dict | None = None) -> None:
        self._take(len(self._queue or ()))  # a fit stopped mid-epoch (stop_training, an error)
        self._flush()
        dataset = self._dataset()
        if self._queue is not None:
            dataset.unfollow(self._queue)
            self._queue = None

    def _take(self, count: int) -> None:
        queue = self._queue
        if queue is None:
            return
        for _ in range(min(count, len(queue))):
            self._pending.append(_real_rows(queue.popleft()[1]))

    def findings(self, options: NoiseOptions = NoiseOptions()) -> dict:  # noqa: B008 - a frozen dataclass
        """The ``label_noise`` findings of what was recorded (``LabelNoiseRecorder.findings``)."""
        return self.recorder.findings(options)

    def _flush(self) -> None:
        pending, self._pending = [b for b in self._pending if len(b["id"])], []
        for batch in _joined(pending):
            self._record(batch)

    def _record(self, batch: dict) -> None:
        outputs = self.model.predict_on_batch(self._layout.to_keras(batch)[0])
        self.recorder.record(batch["id"], self._pick(outputs), batch[self._label])

    def _pick(self, outputs: Any) -> np.ndarray:
        if isinstance(outputs, dict):
            if self.output is None:
                raise ValueError(f"the model has outputs {sorted(outputs)}: say which, LabelNoiseMonitor(..., output=)")
            outputs = outputs[self.output]
        elif isinstance(outputs, (list, tuple)):
            if self.output is None and len(outputs) > 1:
                raise ValueError(f"the model has {len(outputs)} outputs: say which, LabelNoiseMonitor(..., output=)")
            outputs = outputs[int(self.output or 0)]
        return np.asarray(keras.ops.convert_to_numpy(outputs))


def _real_rows(batch: dict) -> dict:
    """The batch without its pad rows (they are no samples) and without the mask."""
    mask = batch.get("mask")
    if mask is None:
        return batch
    real = mask != 0
    return {key: value[real] for key, value in batch.items() if key != "mask"}


def _joined(batches: list[dict]) -> list[dict]:
    """The batches as one (rows concatenated), or as they are when their layouts differ
    (``collate="pad"`` batches of different widths)."""
    if len(batches) < 2:
        return batches
    first = batches[0]
    same = all(
        b.keys() == first.keys()
        and all(b[k].shape[1:] == first[k].shape[1:] and b[k].dtype == first[k].dtype for k in first)
        for b in batches
    )
    return [{k: np.concatenate([b[k] for b in batches]) for k in first}] if same else batches
