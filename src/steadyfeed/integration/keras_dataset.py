"""KerasDataset: a steadyfeed Loader as a ``keras.utils.PyDataset`` for fit, evaluate and predict.

Guarantees (TensorFlow, JAX and PyTorch backends; public Keras API only):

* **steadyfeed's order, every batch once**: Keras's batch index (shuffled by ``fit``) is
  ignored; the loader's ``shuffle``/``sampler`` orders the data. Without a step count one
  Keras epoch is one loader epoch. ``as_keras(steps_per_epoch=N)`` makes every Keras epoch the
  next N batches of the loader's stream, crossing loader epochs, so each loader epoch still
  delivers every sample exactly once. ``fit(steps_per_epoch=...)``, ``validation_steps``,
  ``evaluate(steps=)``, ``predict(steps=)`` and ``keras.config.set_max_steps_per_epoch`` work
  as Keras makes them work for any finite PyDataset (of ``len(loader)`` batches): Keras carries
  one pass across its epochs and ends an epoch early where the loader's epoch ends.
* **every call starts clean**: whatever way a ``fit``, ``evaluate`` or ``predict`` ended
  (normally, ``stop_training``, an exception, Ctrl-C), the next call on the dataset starts a
  whole loader epoch (``feed.py`` says which), never the leftovers of the last one; a position
  restored with ``LoaderCheckpoint`` / ``load_state_dict`` is honoured instead (a resumed
  epoch ends early, its "ran out of data" warning silenced).
* **exact numbers under ``last_batch="pad"``**: padded rows are removed before Keras sees a
  batch (``padding="strip"``, the default on one shard), so losses, metrics, ``predict``
  (one row per sample) and ``class_weight`` are those of the real rows. With several shards
  the default is ``padding="weight"``: every batch keeps its full size (replicas must feed
  equal shapes) and the pad mask is the sample weight.
* **errors as themselves**: a failing sample raises a :class:`~steadyfeed.SampleError` (with
  its id, file, epoch and attempts) that is also an instance of the original exception's type,
  so ``except ValueError`` catches a ``ValueError`` raised in a worker. On TF, ``tf.data``
  re-raises it as its own error type with the message; the message then says that
  ``dataset.last_error`` holds the original.
* **one view per loader**: a second live ``KerasDataset`` of the same loader is refused (as
  training and validation data, two views would take turns with the loader's epochs).
* the concurrency is steadyfeed's: Keras is told ``workers=1, use_multiprocessing=False`` and
  runs no enqueuer of its own; ``for batch in dataset`` runs a pass with the loader's workers.
  A loader built without ``workers`` runs ``workers="auto"`` here (``execution/auto.py``).

On the PyTorch backend the arrays reach Keras as ``torch.from_numpy`` tensors sharing the
batch's memory (fresh, or a process worker's lent slot, held until the tensor goes): Keras's
own conversion of a numpy batch copies it (``np.array(x)``) in the training thread, between
two steps. Dtypes Keras converts specially (``uint32``, ``bfloat16``), other byte orders, and
read-only or non-contiguous arrays stay numpy.

``loader.state_dict()`` counts batches *handed to Keras*; on TF, ``tf.data`` prefetch pulls
ahead of training. ``LoaderCheckpoint`` counts batches *trained*.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from .checks import check_batch
from .feed import KerasFeed
from .layout import BatchLayout
from .shapes import peek_any

_RAN_OUT = "Your input ran out of data"
PADDING_MODES = ("strip", "weight")
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loader -> weakref to its KerasDataset


def view_of(loader: Any) -> KerasDataset | None:
    """The live KerasDataset of ``loader``, if it has one."""
    ref = _VIEWS.get(loader)
    return None if ref is None else ref()


# the dtypes that torch.from_numpy takes and Keras's torch backend converts unchanged
_TORCH_AS_IS = frozenset(
    np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64)
)


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


def _unpadded(batch: dict) -> dict:
    """The batch without the rows ``last_batch="pad"`` added (they come last) and without its mask."""
    mask = batch.get("mask")
    if mask is None:
        return batch
    real = int(np.count_nonzero(mask))
    return {key: value[:real] for key, value in batch.items() if key != "mask"}


class KerasDataset(keras.utils.PyDataset):
    """A :class:`~steadyfeed.Loader` for ``model.fit`` / ``evaluate`` / ``predict``.

    ``x`` and ``y`` name a batch key, a tuple of keys, or a dict ``{model input name: batch
    key}``; ``y=None`` for predict. ``sample_weight`` names a key of per-sample weights.
    ``steps_per_epoch=N``: every Keras epoch takes the next N batches of the loader's stream.
    ``padding``: what ``last_batch="pad"`` rows become (``"strip"``: removed, ``"weight"``:
    kept with weight 0; default: strip on one shard, weight on several).
    Use it where Keras takes data: ``model.fit(loader.as_keras(), epochs=3)``, and
    ``validation_data=val_loader.as_keras()`` with a second, unshuffled loader.
    """

    def __init__(
        self,
        loader: Any,
        x: Any = "x",
        y: Any = "y",
        sample_weight: str | None = None,
        *,
        steps_per_epoch: int | None = None,
        padding: str | None = None,
    ) -> None:
        super().__init__(
            workers=1, use_multiprocessing=False
        )  # no Keras enqueuer: the loader's workers are the workers
        if steps_per_epoch is not None and not (isinstance(steps_per_epoch, int) and steps_per_epoch >= 1):
            raise ValueError(f"steps_per_epoch must be an int >= 1 or None, got {steps_per_epoch!r}")
        shards = loader.config.sharding.shard_count
        padding = padding or ("strip" if shards == 1 else "weight")
        if padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {padding!r}")
        if len(loader) == 0:
            raise ValueError(
                f"{loader!r} has no batches to give Keras (an empty source or shard, or "
                "last_batch='drop' with fewer samples than batch_size)"
            )
        self._claim(loader)
        loader._serve_framework()  # workers left unset: "auto" (a training loop wants its data made alongside)
        self.loader = loader
        self.layout = BatchLayout(x, y, sample_weight)
        self.padding = padding
        self.feed = KerasFeed(loader, steps_per_epoch)
        self.feed.report = lambda position, batch: self.on_batch(batch, *position)
        self.last_error: Exception | None = None  # the last loader error raised to Keras
        self._quiet: warnings.catch_warnings | None = None
        self._to_backend = _backend_arrays()
        self._on_tf = keras.backend.backend() == "tensorflow"

    def _claim(self, loader: Any) -> None:
        other = view_of(loader)
        if other is not None and other is not self:
            raise ValueError(
                f"{loader!r} already has a KerasDataset ({other!r}): one loader feeds one dataset, for fit, evaluate "
                "and predict alike. Two views (say, as training and validation data) would take turns with the "
                "loader's epochs. Validate on a loader of its own, e.g. steadyfeed.Loader(val_source, batch_size) "
                "(unshuffled, no augmentation); or close() the other view first."
            )
        _VIEWS[loader] = weakref.ref(self)

    # -- what Keras asks -----------------------------------------------------------------
    def __len__(self) -> int:
        return self.feed.full_length()

    @property
    def num_batches(self) -> int:
        """Batches of a Keras epoch; to a generator Keras starts, the batches of its pass
        (a resumed epoch's are fewer, which is how it ends early)."""
        return self.feed.length()

    def __getitem__(self, index: int) -> tuple:
        try:
            taken = self.feed.take()
        except Exception as error:
            self.last_error = error
            raise self._for_keras(error) from error.__cause__
        # outside an epoch (Keras reading shapes, a tf.data signature) a batch is computed alone
        batch = peek_any(self.loader, index % len(self.loader)) if taken is None else taken[1]
        if self.padding == "strip":
            batch = _unpadded(batch)
        return self._to_backend(self.layout.to_keras(batch))

    def on_epoch_begin(self) -> None:
        self._end_quiet()  # one Keras left open (stop_training, an exception in a previous call)
        self.feed.begin()
        if self.feed.full_length() > self._next_pass_length():
            # a resumed epoch: Keras will see it end early, by design; its warning would mislead
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_epoch_end(self) -> None:
        self.feed.end()
        self._end_quiet()

    def __iter__(self) -> Iterator[tuple]:
        """One pass as Keras would run it (a Keras epoch), made by the loader's workers."""
        self.on_epoch_begin()
        for index in range(self.num_batches):
            yield self[index]
        self.on_epoch_end()  # a loop left early leaves the epoch open: the next one starts it again

    # -- for users ------------------------------------------------------------------------
    def check(self, model: Any) -> KerasDataset:
        """Raise an error naming the batch key, the model input and both shapes (or the
        missing key) when this dataset's batches cannot feed ``model``; returns the dataset,
        so ``model.fit(loader.as_keras().check(model))`` checks before Keras builds anything.
        Costs one batch computed inline."""
        check_batch(peek_any(self.loader, 0), self.layout, model)
        return self

    def on_batch(self, batch: dict, epoch: int, index: int) -> None:
        """Called once with every loader batch the stream produces for Keras (all its keys,
        ``"id"`` included under ``with_ids=True``), with its loader epoch and position in it;
        a batch served again after Keras discarded it (a build probe) is not reported twice.
        Does nothing; override to record or inspect. On TF it runs in a tf.data thread."""

    def trained(self, count: int) -> list[tuple[int, int]]:
        """The loader's cursor after each of the next ``count`` batches Keras took, oldest first
        (for a callback that counts trained steps, e.g. ``LoaderCheckpoint``)."""
        return self.feed.trained(count)

    def follow(self) -> deque:
        """A queue of ``(position, batch)`` for every batch Keras takes from now on, oldest first
        (all the loader's keys, pad rows and ``"mask"`` included; see ``KerasFeed.follow``), for a
        callback that needs the trained batches themselves (``LabelNoiseMonitor``): it pops one
        entry per trained step. ``unfollow`` it when done."""
        return self.feed.follow()

    def unfollow(self, follower: deque) -> None:
        self.feed.unfollow(follower)

    def close(self) -> None:
        """Stop the loader's epoch in progress and release this view of the loader."""
        self.feed.close()
        if view_of(self.loader) is self:
            del _VIEWS[self.loader]

    # -- internals ------------------------------------------------------------------------
    def _next_pass_length(self) -> int:
        epoch, next_batch = self.feed.position()
        return self.feed.steps or self.loader.batches_in(epoch) - next_batch

    def _for_keras(self, error: Exception) -> Exception:
        """On TF, tf.data re-raises an error as its own type with the message: say where the original is."""
        if not self._on_tf:
            return error
        first, newline, rest = str(error).partition("\n")
        told = copy.copy(error)
        told.args = (
            f"{first} [the original {type(error).__name__}, with its sample_id, location, epoch and "
            f"attempts, is this KerasDataset's last_error]{newline}{rest}",
        )
        return told

    def _end_quiet(self) -> None:
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            quiet.__exit__(None, None, None)

    def __repr__(self) -> str:
        return f"KerasDataset({self.loader!r}, {self.layout})"
