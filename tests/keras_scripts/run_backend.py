"""End-to-end checks of steadyfeed under Keras on one backend (KERAS_BACKEND, set by the caller).

Prints one line ``REPORT {json}`` that tests/test_keras_integration.py parses. Every check
records facts (numbers, booleans, messages); the test decides what passes.

The top level imports numpy and steadyfeed only: steadyfeed's spawned workers (process
mode) re-import this file as ``__mp_main__``, and must not import Keras.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from common import BATCH, N_TRAIN, N_VAL, WIDTH, FailingSource, jitter, train_source, two_input_source, val_source  # noqa: E402

import steadyfeed as sf  # noqa: E402

EPOCHS = 3
CRASH_EPOCH, CRASH_STEP, SAVE_FREQ = 1, 11, 5


def main() -> None:
    import keras

    from steadyfeed.keras import KerasDataset, LoaderCheckpoint, LoaderMonitor

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()

    class Recording(KerasDataset):
        """Records the ids of every batch handed to Keras, per loader epoch."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handed = {}

        def on_batch(self, batch, epoch, index):
            self.handed.setdefault(epoch, []).append((index, batch["id"].tolist()))

    class StepCounter(keras.callbacks.Callback):
        """Batches trained per Keras epoch."""

        def __init__(self):
            super().__init__()
            self.trained = {}

        def on_train_batch_end(self, batch, logs=None):
            self.trained[self._epoch] = batch + 1

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch
            self.trained[epoch] = 0

    class Crash(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self._epoch == CRASH_EPOCH and batch == CRASH_STEP:
                raise RuntimeError("simulated kill")

    def make_model(width=WIDTH, strategy=None):
        keras.utils.set_random_seed(0)
        with strategy.scope() if strategy else _nullcontext():
            model = keras.Sequential(
                [keras.Input((width,), name="features"), keras.layers.Dense(1, activation="sigmoid")]
            )
            model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy"])
        return model

    def train_loader(mode="thread", workers=2, shuffled=False, **kw):
        return sf.Loader(
            train_source(shuffled),
            BATCH,
            shuffle=True,
            seed=0,
            transform=jitter,
            workers=workers,
            mode=mode,
            with_ids=True,
            **kw,
        )

    def val_loader(**kw):
        return sf.Loader(val_source(), BATCH, **kw)

    def fit(loader, *, model=None, callbacks=(), validate=True, epochs=EPOCHS, crash=False):
        """Trains; returns (model, history, {epoch: [batch ids trained, in order]}, {epoch: batches handed},
        {epoch: steps trained}). With crash=True, history is the exception fit raised."""
        model = model or make_model()
        dataset, counter = Recording(loader), StepCounter()
        val = val_loader() if validate else None
        try:
            history = model.fit(
                dataset,
                epochs=epochs,
                verbose=0,
                callbacks=[LoaderMonitor(loader), counter, *callbacks],
                validation_data=val.as_keras() if val else None,
            )
        except RuntimeError as error:
            if not crash:
                raise
            history = error
        finally:
            loader.close()
            if val:
                val.close()
        trained = {}
        for keras_epoch, steps in counter.trained.items():
            # Keras epoch e serves loader epoch e (aligned); on TF more may have been handed than trained
            trained[keras_epoch] = [ids for _, ids in dataset.handed.get(keras_epoch, [])][:steps]
        handed = {e: len(rows) for e, rows in dataset.handed.items()}
        return model, history, trained, handed, counter.trained

    def weights_digest(model):
        h = hashlib.sha256()
        for w in model.get_weights():
            h.update(np.ascontiguousarray(w).tobytes())
        return h.hexdigest()

    def exactly_once(trained):
        return all(sorted(i for ids in batches for i in ids) == list(range(N_TRAIN)) for batches in trained.values())

    def evaluate(model, loader):
        try:
            return model.evaluate(loader.as_keras(), verbose=0, return_dict=True)
        finally:
            loader.close()

    report = {"backend": backend}

    def check(name, fn):
        try:
            report[name] = fn()
        except Exception:
            report[name] = {"error": traceback.format_exc()}

    # -- training in every mode: loss falls, pairs intact, same seed -> same weights ------------
    def modes():
        out, digests = {}, {}
        for label, mode, workers in (("thread", "thread", 2), ("process", "process", 2), ("inline", "thread", 0)):
            initial = evaluate(make_model(), val_loader())
            model, history, trained, handed, steps = fit(train_loader(mode, workers))
            digests[label] = weights_digest(model)
            out[label] = {
                "initial_val_loss": initial["loss"],
                "final_val_loss": history.history["val_loss"][-1],
                "final_val_accuracy": history.history["val_accuracy"][-1],
                "exactly_once": exactly_once(trained),
                "steps": list(steps.values()),
                "handed": [handed.get(e, 0) for e in range(EPOCHS)],
                "history": {k: v for k, v in history.history.items() if k.startswith("data_")},
            }
            if label == "thread":
                reference["trained"], reference["digest"] = trained, digests[label]
        out["same_weights_all_modes"] = len(set(digests.values())) == 1
        return out

    reference = {}
    check("modes", modes)

    def shuffled_labels():
        _, history, *_ = fit(train_loader(shuffled=True))
        return {"final_val_accuracy": history.history["val_accuracy"][-1]}

    check("shuffled_labels", shuffled_labels)

    # -- kill mid-epoch, resume with BackupAndRestore + LoaderCheckpoint ------------------------
    def resume(root):
        backup, position = os.path.join(root, "backup"), os.path.join(root, "loader")

        def callbacks(loader):
            return [
                keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ),
                LoaderCheckpoint(loader, position, save_freq=SAVE_FREQ),
            ]

        loader = train_loader()
        _, error, crashed, _, crashed_steps = fit(
            loader, callbacks=[*callbacks(loader), Crash()], validate=False, crash=True
        )
        with open(os.path.join(position, "steadyfeed_loader.json")) as f:
            saved = json.load(f)
        with open(os.path.join(backup, "training_metadata.json")) as f:
            keras_saved = json.load(f)
        # what the crashed run contributes: everything trained up to the last save (later steps are lost with it)
        first_part = {e: crashed[e] for e in range(saved["epoch"])}
        first_part[saved["epoch"]] = crashed[saved["epoch"]][: saved["next_batch"]]

        loader = train_loader(workers=1, mode="process")  # resume into other settings
        checkpoint_cb = callbacks(loader)
        restored = checkpoint_cb[1].restored
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, history, trained, handed, steps = fit(loader, callbacks=checkpoint_cb, validate=False)
        combined = {e: first_part.get(e, []) + trained.get(e, []) for e in range(EPOCHS)}
        return {
            "crashed_by": str(error),
            "crashed_steps": crashed_steps,
            "saved": {"epoch": saved["epoch"], "next_batch": saved["next_batch"]},
            "keras_saved": keras_saved,
            "restored": restored is not None,
            "resumed_steps": steps,
            "same_trained_batches": combined == reference["trained"],
            "same_weights": weights_digest(model) == reference["digest"],
            "ran_out_warnings": sum("ran out of data" in str(w.message) for w in caught),
            "loader_file_deleted": not os.path.exists(os.path.join(position, "steadyfeed_loader.json")),
        }

    def resume_in_a_temporary_directory():
        root = tempfile.mkdtemp(prefix="sf-resume-")
        try:
            return resume(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    check("resume", resume_in_a_temporary_directory)

    # -- pad: the mask is the sample weight, so padded rows count for nothing ------------------
    def pad_and_predict():
        model, *_ = fit(train_loader(), epochs=1, validate=False)
        # compile(metrics=...) ignores sample weights in Keras; weighted_metrics honour the pad mask
        model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", weighted_metrics=["accuracy"])
        plain = evaluate(model, val_loader())
        padded = evaluate(model, val_loader(last_batch="pad"))
        pad_loader = val_loader(last_batch="pad")
        try:
            predictions = model.predict(pad_loader.as_keras(y=None), verbose=0)
        finally:
            pad_loader.close()
        trained_pad = fit(
            sf.Loader(train_source(), BATCH, shuffle=True, last_batch="pad", with_ids=True), epochs=1, validate=False
        )[1]
        return {
            "accuracy_plain": plain["accuracy"],
            "accuracy_padded": padded["accuracy"],
            "predict_rows": int(predictions.shape[0]),
            "predict_expected": N_VAL,
            "pad_fit_loss": trained_pad.history["loss"][0],
        }

    check("pad_and_predict", pad_and_predict)

    # -- errors before training -------------------------------------------------------------
    def errors():
        out = {}
        for name, run in {
            "shape": lambda: (lambda m: m.fit(val_loader().as_keras().check(m), epochs=1, verbose=0))(
                make_model(width=5)
            ),
            "missing_key": lambda: make_model().fit(val_loader().as_keras(x="pixels"), epochs=1, verbose=0),
            "dict_unknown_input": lambda: (
                lambda m: m.fit(
                    sf.Loader(two_input_source(), BATCH).as_keras(x={"left": "left", "rite": "right"}).check(m),
                    epochs=1,
                    verbose=0,
                )
            )(two_input_model()),
        }.items():
            try:
                run()
                out[name] = {"raised": None}
            except Exception as error:
                out[name] = {"raised": type(error).__name__, "message": str(error)}
        return out

    def two_input_model():
        keras.utils.set_random_seed(0)
        left, right = keras.Input((4,), name="left"), keras.Input((4,), name="right")
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([left, right]))
        model = keras.Model({"left": left, "right": right}, out)
        model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy"])
        return model

    check("errors", errors)

    def sample_error():
        loader = sf.Loader(FailingSource(), BATCH, workers=2)
        dataset = loader.as_keras()
        try:
            make_model().fit(dataset, epochs=1, verbose=0)
            raised = None
        except Exception as error:
            raised = error
        finally:
            loader.close()
        return {
            "raised": type(raised).__name__,
            "names_sample": "sample 77" in str(raised),
            "last_error": type(dataset.last_error).__name__,
            "last_error_id": getattr(dataset.last_error, "sample_id", None),
        }

    check("sample_error", sample_error)

    def multi_input():
        loader = sf.Loader(two_input_source(), BATCH, shuffle=True)
        history = two_input_model().fit(loader.as_keras(x={"left": "left", "right": "right"}), epochs=2, verbose=0)
        loader.close()
        return {"loss": history.history["loss"]}

    check("multi_input", multi_input)

    def monitor_figures():
        from steadyfeed.keras import epoch_figures
        from steadyfeed.stats import LoaderStats

        before = LoaderStats(batches=10, samples=320, wait_seconds=1.0, fill_total=20, skipped=0).as_dict()
        after = LoaderStats(batches=30, samples=960, wait_seconds=1.5, fill_total=90, skipped=2).as_dict()
        return epoch_figures(before, after, seconds=4.0)

    check("monitor_figures", monitor_figures)

    check("extras", {"tensorflow": tf_extras, "jax": jax_extras, "torch": torch_extras}[backend])
    check("leaks", leftovers)
    print("REPORT " + json.dumps(report), flush=True)


def leftovers(wait: float = 5.0) -> dict:
    """Worker processes and threads still alive after every loader was closed (as conftest's no_leaks)."""
    import gc
    import threading
    import time

    import psutil

    deadline = time.monotonic() + wait
    while True:
        gc.collect()  # generators of epochs Keras abandoned (the crash) finish here
        children = [
            c.pid for c in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(_cmdline(c))
        ]
        threads = [t.name for t in threading.enumerate() if t.name.startswith("steadyfeed-") and t.is_alive()]
        if (not children and not threads) or time.monotonic() > deadline:
            return {"children": children, "threads": threads}
        time.sleep(0.1)


def _cmdline(process) -> list:
    try:
        return process.cmdline()
    except Exception:
        return []


def tf_extras() -> dict:
    """tf.data signature, tf.distribute, and fit under a strategy (Keras's build probe path)."""
    import keras
    import tensorflow as tf

    from steadyfeed.keras import KerasDataset, shard_from_tf_input_context

    out = {}
    loader = sf.Loader(train_source(), BATCH, last_batch="pad", with_ids=True)
    ds = loader.as_tf_dataset()
    out["signature"] = {k: [str(s.dtype.name), list(s.shape.as_list())] for k, s in ds.element_spec.items()}
    out["signature_keras"] = repr(sf.Loader(train_source(), BATCH).as_tf_dataset(x="x", y="y").element_spec)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    ids = []
    for batch in strategy.experimental_distribute_dataset(ds):
        ids.extend(int(i) for i, m in zip(batch["id"].numpy(), batch["mask"].numpy()) if m)
    out["distributed_exactly_once"] = sorted(ids) == list(range(N_TRAIN))
    out["cursor_after_one_pass"] = loader.state_dict()["epoch"]
    loader.close()

    def per_pipeline(ctx):
        return sf.Loader(
            train_source(),
            ctx.get_per_replica_batch_size(BATCH),
            last_batch="pad",
            with_ids=True,
            **shard_from_tf_input_context(ctx),
        ).as_tf_dataset()

    ids = []
    for batch in strategy.distribute_datasets_from_function(per_pipeline):
        ids.extend(int(i) for i, m in zip(batch["id"].numpy(), batch["mask"].numpy()) if m)
    out["from_function_exactly_once"] = sorted(ids) == list(range(N_TRAIN))
    out["shard_of_context"] = shard_from_tf_input_context(
        tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=1)
    )

    # fit under a strategy: Keras runs its build probe through tf.data (prefetching)
    handed = []

    class Recording(KerasDataset):
        def on_batch(self, batch, epoch, index):
            handed.append((epoch, batch["id"].tolist()))

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy"])
    loader = sf.Loader(train_source(), BATCH, shuffle=True, with_ids=True)
    model.fit(Recording(loader), epochs=2, verbose=0)
    loader.close()
    out["strategy_fit_exactly_once"] = all(
        sorted(i for e, ids in handed if e == epoch for i in ids) == list(range(N_TRAIN)) for epoch in (0, 1)
    )
    out["strategy_fit_batches"] = len(handed)
    return out


def jax_extras() -> dict:
    import jax

    from steadyfeed.keras import shard_from_jax

    loader = sf.Loader(train_source(), BATCH, workers=2, mode="thread")
    batch = next(iter(loader))
    on_device = jax.device_put(batch)
    out = {
        "device_put_types": sorted({type(v).__name__ for v in on_device.values()}),
        "device_put_equal": all(np.array_equal(np.asarray(on_device[k]), batch[k]) for k in batch),
        "shard": shard_from_jax(),
    }
    loader.close()
    return out


def torch_extras() -> dict:
    from torch.utils.data import DataLoader

    from steadyfeed.keras import shard_from_torch

    loader = sf.Loader(train_source(), BATCH, with_ids=True, workers=2)
    ds = loader.as_torch()
    first = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    out = {
        "types": sorted({type(v).__name__ for v in first.values()}),
        "dtypes": {k: str(v.dtype) for k, v in first.items()},
        "len": len(ds),
    }
    loader.close()
    loader = sf.Loader(train_source(), BATCH, with_ids=True)
    out["epoch_exactly_once"] = sorted(int(i) for b in loader.as_torch() for i in b["id"]) == list(range(N_TRAIN))
    loader.close()
    loader = sf.Loader(train_source(), BATCH)
    try:
        next(iter(DataLoader(loader.as_torch(), batch_size=None, num_workers=1)))
        out["torch_workers"] = "no error"
    except Exception as error:
        out["torch_workers"] = str(error)
    loader.close()
    os.environ.update(RANK="2", WORLD_SIZE="4")
    out["shard_env"] = shard_from_torch()
    out.update(keras_step_arrays())
    return out


def keras_step_arrays() -> dict:
    """What a Keras step gets from KerasDataset on torch: zero-copy tensors, numpy where Keras converts."""
    from steadyfeed.integration.keras_dataset import _backend_arrays

    loader = sf.Loader(train_source(), BATCH, workers=2)
    dataset = loader.as_keras()
    dataset.on_epoch_begin()
    step = dataset[0]
    dataset.on_epoch_end()
    loader.close()
    writable, frozen = np.ones(3, np.float32), np.ones(3, np.float32)
    frozen.flags.writeable = False
    kept_as_numpy = (np.ones(3, np.uint32), frozen, np.ones(3, ">f4"), np.ones(6, np.float32)[::-2])
    tensor, kept, named = _backend_arrays()((writable, kept_as_numpy, {"a": writable}))
    return {
        "keras_step_types": [type(v).__name__ for v in step],
        "keras_zero_copy": tensor.data_ptr() == named["a"].data_ptr() == writable.ctypes.data,
        "keras_kept_numpy": [type(v).__name__ for v in kept],
    }


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
