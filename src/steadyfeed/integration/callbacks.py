"""Keras callbacks for a steadyfeed loader: ``LoaderMonitor`` (figures in the logs) and
``LoaderCheckpoint`` (resume mid-epoch together with ``keras.callbacks.BackupAndRestore``).

Both take the training ``Loader`` (or its ``KerasDataset``). When Keras epochs are loader epochs
(no step count), both make the loader's next epoch the epoch Keras begins, when the loader's
cursor sits at the start of an epoch (Keras calls callbacks' ``on_epoch_begin`` before the
dataset's), so loader epoch == Keras epoch, also after ``initial_epoch`` or a restore by
``BackupAndRestore``. With a step count the loader's epochs simply follow one another.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any

import keras

from ..files import atomic_write
from ..stats import stats_delta
from .epochs import align_epoch
from .keras_dataset import KerasDataset, view_of

STATE_FILE = "steadyfeed_loader.json"


class _LoaderCallback(keras.callbacks.Callback):
    def __init__(self, data: Any) -> None:
        super().__init__()
        self.loader = data.loader if isinstance(data, KerasDataset) else data

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.params.get("steps") in (None, len(self.loader)):  # Keras epochs are loader epochs
            align_epoch(self.loader, epoch)

    def _dataset(self) -> KerasDataset:
        dataset = view_of(self.loader)
        if dataset is None:
            raise ValueError(
                f"{type(self).__name__} counts the batches Keras trained through the loader's "
                "KerasDataset: train on loader.as_keras()"
            )
        return dataset


class LoaderMonitor(_LoaderCallback):
    """Adds the loader's figures for each epoch to Keras's ``logs`` at epoch end, so
    ``History``, ``CSVLogger`` and ``TensorBoard`` record them (list it before those):

    * ``data_samples_per_sec``: samples delivered / training time of the epoch;
    * ``data_wait_fraction``: time the loader's consumer waited for a batch / training time.
      On JAX and PyTorch the consumer is the training loop, so this is the device-idle
      share caused by data. On TF, ``tf.data`` prefetch runs the consumer in its own thread
      and hides part of the wait from training: the figure is then an upper bound;
    * ``data_wait_ms_per_step``: the same wait per batch, in milliseconds, which faster or
      slower steps do not scale (a fraction shrinks when the steps get slower);
    * ``data_queue_fill``: mean number of batches ready when one was taken (0: the
      training loop always waited; near ``prefetch``: data was never the bottleneck);
    * ``data_quarantined``: samples skipped so far under ``on_error="skip"``;
    * ``data_from_pack``: the share of the epoch's batches read from the ``pack_to`` shards
      (0 while the files are read, 1 once the pack is).

    The training time of an epoch runs from ``on_epoch_begin`` to its last
    ``on_train_batch_end``, so validation does not dilute the figures.
    """

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self._t0 = self._t_last = time.perf_counter()
        self._s0 = self.loader.stats()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._t_last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs.update(epoch_figures(self._s0, self.loader.stats(), self._t_last - self._t0))


def epoch_figures(before: dict, after: dict, seconds: float) -> dict:
    """The LoaderMonitor figures from two ``loader.stats()`` snapshots ``seconds`` apart."""
    delta = stats_delta(before, after)
    seconds = max(seconds, 1e-9)
    batches = delta["batches"]
    return {
        "data_samples_per_sec": delta["samples"] / seconds,
        "data_wait_fraction": delta["wait_seconds"] / seconds,
        "data_wait_ms_per_step": 1000 * delta["wait_seconds"] / batches if batches else 0.0,
        "data_queue_fill": delta["queue_fill_mean"],
        "data_quarantined": float(after["skipped"]),
        "data_from_pack": delta["pack_batches"] / batches if batches else 0.0,
    }


class _SaveSchedule:
    """When ``BackupAndRestore(save_freq=...)`` saves: the same counting, step for step
    (``_should_save_on_batch`` in keras 3.15.1, ``steps_per_execution`` included)."""

    def __init__(self, save_freq: Any) -> None:
        if save_freq != "epoch" and not (
            isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq >= 1
        ):
            raise ValueError(
                f"save_freq must be 'epoch' or an int >= 1, as given to BackupAndRestore; got {save_freq!r}"
            )
        self.save_freq = save_freq
        self._since_save = 0
        self._last_batch = 0

    def batch_due(self, batch: int) -> bool:
        if self.save_freq == "epoch":
            return False
        self._since_save += batch + 1 if batch <= self._last_batch else batch - self._last_batch
        self._last_batch = batch
        if self._since_save >= self.save_freq:
            self._since_save = 0
            return True
        return False

    def epoch_ended(self) -> None:
        self._last_batch = 0


class LoaderCheckpoint(_LoaderCallback):
    """Saves where training stands in the loader, so a killed ``fit`` resumes mid-epoch.

    Use it with ``keras.callbacks.BackupAndRestore(backup_dir, save_freq=N)`` and the same
    ``save_freq``: both save at the same step, BackupAndRestore the weights, this the loader
    position: the epoch and the number of its batches **trained** (counted in
    ``on_train_batch_end``; the loader's own cursor runs ahead under ``tf.data`` prefetch),
    as JSON in ``directory/steadyfeed_loader.json``, written atomically.

    Constructing it restores a saved position into the loader (before ``fit`` starts).
    BackupAndRestore restores the weights and restarts the interrupted epoch at Keras step 0;
    the dataset then serves only the batches not yet trained, so that epoch ends early
    (its "ran out of data" warning is silenced) and the next epochs run in full. The batches
    trained across the interruption are exactly those of an uninterrupted run, also with
    ``steps_per_epoch`` (the position saved is the loader's cursor after the last batch
    trained, from ``KerasDataset.trained``).

    ``directory`` is this callback's own (it may sit inside ``backup_dir``). Like
    BackupAndRestore, the file is deleted when ``fit`` completes (``delete_checkpoint``).
    """

    def __init__(
        self,
        data: Any,
        directory: str | os.PathLike[str],
        save_freq: int | str = "epoch",
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__(data)
        self.schedule = _SaveSchedule(save_freq)
        self.path = os.path.join(os.fspath(directory), STATE_FILE)
        self.delete_checkpoint = delete_checkpoint
        self.restored = self._restore()  # the loader state restored, or None
        self._trained_steps = 0  # of the current Keras epoch
        self._next = self.loader.cursor  # the loader's cursor after the last batch trained

    def _restore(self) -> dict | None:
        if not os.path.exists(self.path):
            return None
        with open(self.path) as f:
            state = json.load(f)
        self.loader.load_state_dict(state)
        return state

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self._trained_steps = 0
        self._next = cursor = self.loader.cursor
        if cursor[1] and cursor[0] != epoch and self.params.get("steps") in (None, len(self.loader)):
            warnings.warn(
                f"Keras begins epoch {epoch} but the loader resumes epoch {cursor[0]} at batch "
                f"{cursor[1]}: the weights and the loader position describe different steps. Was "
                "BackupAndRestore given the same save_freq? (keras 3.15.1's BackupAndRestore also records "
                "epoch 0 for a save made inside the first epoch of a resumed fit.)",
                stacklevel=2,
            )

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        for trained in self._dataset().trained(batch + 1 - self._trained_steps):  # steps_per_execution
            self._next = trained  # the position after the last batch trained
        self._trained_steps = batch + 1
        if self.schedule.batch_due(batch):
            self._save()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.schedule.epoch_ended()
        if self.schedule.save_freq == "epoch":
            self._save()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.delete_checkpoint and os.path.exists(self.path):
            os.remove(self.path)

    def _save(self) -> None:
        state = {**self.loader.state_dict(), "epoch": self._next[0], "next_batch": self._next[1]}
        atomic_write(self.path, json.dumps(state).encode())  # a reader never sees a torn file
