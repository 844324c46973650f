"""KerasDataset: a steadyfeed Loader as a ``keras.utils.PyDataset`` for fit, evaluate and predict.

Guarantees (TensorFlow, JAX and PyTorch backends):

* **one Keras epoch is one steadyfeed epoch, in steadyfeed's order**: every batch of the
  loader's plan is handed to Keras exactly once per epoch, whatever ``shuffle`` Keras was
  given (``fit`` shuffles by default: it then asks for batch indices in a random order,
  which are ignored inside an epoch; shuffling is the loader's ``shuffle``/``sampler``);
* the concurrency is steadyfeed's: the dataset tells Keras ``workers=1,
  use_multiprocessing=False``, so Keras runs no enqueuer of its own on top;
* outside an epoch (Keras reading shapes for a ``tf.data`` signature, or its build probe,
  see ``keras_hooks``) a batch is computed with ``loader.peek``: no loader batch is used up
  and the cursor does not move;
* an epoch starts at the loader's cursor: after ``load_state_dict`` (or ``LoaderCheckpoint``)
  it serves only the batches not yet trained and ends early. Keras then warns "Your input
  ran out of data; interrupting training" and goes on with the next epoch normally; that one
  warning is silenced for such an epoch;
* under ``last_batch="pad"`` the pad mask is the sample weight (see ``layout``); pass
  metrics as ``compile(weighted_metrics=...)`` for them to ignore padded rows too (Keras's
  ``metrics=`` ignore sample weights);
* a loader error (``SampleError``, ``TooManyErrors``, ...) reaches ``fit`` as itself on JAX
  and PyTorch; on TF the generator runs in a tf.data thread and TF re-raises it as
  ``tf.errors.UnknownError`` carrying its message; the original is ``dataset.last_error``.

On the PyTorch backend the arrays reach Keras as ``torch.from_numpy`` tensors sharing the
freshly allocated batch memory: Keras's own conversion of a numpy batch copies it
(``np.array(x)``) in the training thread, between two steps, where every microsecond is
device idle time. Dtypes Keras converts specially (``uint32``, ``bfloat16``), other byte
orders, and read-only or non-contiguous arrays stay numpy and take Keras's path.

``loader.state_dict()`` counts batches *handed to Keras*; on TF, ``tf.data`` prefetch pulls
ahead of training. ``LoaderCheckpoint`` counts batches *trained*.
"""
from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable

import keras
import numpy as np

from ..errors import DataError
from . import keras_hooks
from .checks import check_batch
from .layout import BatchLayout
from .shapes import peek_any

_RAN_OUT = "Your input ran out of data"


class _Epoch:
    """The loader's batches for one Keras epoch: from the cursor to the end of its epoch."""

    def __init__(self, loader: Any):
        state = loader.state_dict()
        self.epoch, self.start = int(state["epoch"]), int(state["next_batch"])
        self.remaining = len(loader) - self.start
        self.served = 0
        self._batches = iter(loader)

    def next(self) -> dict:
        try:
            batch = next(self._batches)
        except StopIteration:  # a generator must not leak StopIteration into Keras's generator
            raise DataError(
                f"epoch {self.epoch} of the loader ended after {self.served} of the {self.remaining} batches "
                "Keras was told: on_error='skip' left out batches whose samples all failed "
                "(see loader.quarantine_report())"
            ) from None
        self.served += 1
        return batch

    def close(self) -> None:
        if self.served == self.remaining:
            next(self._batches, None)  # let the loader finish its epoch: it keeps its workers for the next
        self._batches.close()  # cut short: stops the workers, the cursor stays at the next unserved batch


# the dtypes that torch.from_numpy takes and Keras's torch backend converts unchanged
_TORCH_AS_IS = frozenset(np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
                                                 np.float16, np.float32, np.float64))


def _backend_arrays() -> Callable[[Any], Any]:
    """What turns a Keras step's structure of numpy arrays into the backend's own arrays,
    where that saves Keras a copy: zero-copy tensors on PyTorch, the identity elsewhere."""
    if keras.backend.backend() != "torch":
        return lambda structure: structure
    import torch

    def convert(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            flags = value.flags
            keep = value.dtype not in _TORCH_AS_IS or not (flags.writeable and flags.c_contiguous)
            return value if keep else torch.from_numpy(value)
        if isinstance(value, tuple):
            return tuple(convert(v) for v in value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return value

    return convert


class KerasDataset(keras.utils.PyDataset):
    """A :class:`~steadyfeed.Loader` for ``model.fit`` / ``evaluate`` / ``predict``.

    ``x`` and ``y`` name a batch key, a tuple of keys, or a dict ``{model input name: batch
    key}``; ``y=None`` for predict. ``sample_weight`` names a key of per-sample weights.
    Use it where Keras takes data: ``model.fit(loader.as_keras(), epochs=3)``, and
    ``validation_data=val_loader.as_keras()`` with a second, unshuffled loader.
    """

    def __init__(self, loader: Any, x: Any = "x", y: Any = "y", sample_weight: str | None = None):
        super().__init__(workers=1, use_multiprocessing=False)  # no Keras enqueuer: the loader's workers are the workers
        if len(loader) == 0:
            raise ValueError(f"{loader!r} has no batches to give Keras (an empty source or shard, or "
                             "last_batch='drop' with fewer samples than batch_size)")
        self.loader = loader
        self.layout = BatchLayout(x, y, sample_weight)
        self._lock = threading.Lock()  # on TF, __getitem__ runs in a tf.data thread
        self._epoch: _Epoch | None = None
        self._quiet: warnings.catch_warnings | None = None
        self.last_error: Exception | None = None  # the last loader error raised to Keras
        self._checked = weakref.WeakSet()  # models this dataset's batches were checked against
        self._to_backend = _backend_arrays()

    # -- what Keras asks -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)

    @property
    def num_batches(self) -> int:
        """Batches of a full epoch; inside an epoch, the batches that epoch will serve.

        Keras reads it once at the start of ``fit`` (the progress bar, the step bound) and
        again when each epoch's generator starts, which is how a resumed epoch ends early.
        """
        epoch = self._epoch
        return len(self.loader) if epoch is None else epoch.remaining

    def __getitem__(self, index: int) -> tuple:
        with self._lock:
            epoch = self._epoch
            if epoch is None:  # shapes only: a signature read or the build probe
                return self._to_backend(self.layout.to_keras(peek_any(self.loader, index)))
            try:
                batch = epoch.next()  # inside an epoch Keras's (possibly shuffled) index is ignored
            except Exception as error:
                self.last_error = error  # TF re-raises it as tf.errors.UnknownError: keep the original
                raise
            position = epoch.start + epoch.served - 1
        self.on_batch(batch, epoch.epoch, position)
        return self._to_backend(self.layout.to_keras(batch))

    def on_epoch_begin(self) -> None:
        self._end_epoch()  # one Keras left open (an exception or stop_training in a previous fit)
        call = keras_hooks.current_call()
        if call.model is not None and call.model not in self._checked:
            self.check(call.model)  # before the first step, and before Keras's own vaguer shape error
            self._checked.add(call.model)
        if call.probing:
            return  # Keras's build probe: served with peek, outside any epoch
        self._refuse_misuse(call)
        with self._lock:
            self._epoch = _Epoch(self.loader)
        if self._epoch.start > 0:  # resumed mid-epoch: Keras will see this epoch end early, by design
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_epoch_end(self) -> None:
        self._end_epoch()

    # -- for users ------------------------------------------------------------------------
    def check(self, model: Any) -> None:
        """Raise an error naming the batch key, the model input and both shapes (or the
        missing key) when this dataset's batches cannot feed ``model``. Runs by itself at
        the first epoch each model opens on this dataset; costs one batch computed inline."""
        check_batch(peek_any(self.loader, 0), self.layout, model)

    def on_batch(self, batch: dict, epoch: int, index: int) -> None:
        """Called with every loader batch handed to Keras inside an epoch (all its keys,
        ``"id"`` included under ``with_ids=True``), with the loader epoch and the batch's
        position in it. Does nothing; override to record or inspect. On the TF backend it
        runs in a tf.data thread, ahead of training."""

    # -- internals ------------------------------------------------------------------------
    def _refuse_misuse(self, call: keras_hooks.KerasCall) -> None:
        steps = call.steps_per_epoch
        if steps is not None and steps != len(self.loader):
            raise ValueError(
                f"steps_per_epoch / validation_steps / keras.config.max_steps_per_epoch = {steps} would cut the "
                f"loader's epochs of {len(self.loader)} batches; Keras then carries one iterator across its "
                "epochs and batches would be served twice or lost. Leave it unset (one Keras epoch is one "
                "steadyfeed epoch); to train on part of the data per epoch give the Loader a sampler."
            )
        if call.entry == "evaluate" and call.fit_data is self:
            raise ValueError("this KerasDataset is both the training data and the validation_data of fit: "
                             "validation would use up the training loader's next epoch. Validate on a "
                             "loader of its own (unshuffled, without augmentation).")

    def _end_epoch(self) -> None:
        with self._lock:
            epoch, self._epoch = self._epoch, None
            if epoch is not None:
                epoch.close()
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            quiet.__exit__(None, None, None)

    def __repr__(self) -> str:
        return f"KerasDataset({self.loader!r}, {self.layout})"
