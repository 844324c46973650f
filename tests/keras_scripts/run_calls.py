"""Keras as people really call it, on one backend (KERAS_BACKEND, set by the caller): fits cut
short every way, step limits, padded batches, errors, and iteration outside fit, each compared
with a plain ``keras.utils.PyDataset`` over the same arrays.

Prints one line ``REPORT {json}`` that tests/test_keras_calls.py parses: facts only (steps,
rows, losses, messages); the test decides what passes. The top level imports numpy and
steadyfeed only (spawned workers re-import this file).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from common import WIDTH, FailingSource, arrays  # noqa: E402

import steadyfeed as sf  # noqa: E402

ROWS, BATCH = 64, 16  # four batches an epoch
PAD_ROWS = 70  # five batches of 16, the last padded by 10 rows


def main() -> None:
    import keras

    from steadyfeed.keras import KerasDataset

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()

    class Plain(keras.utils.PyDataset):
        """The reference: batch i of the arrays for index i, as Keras users write it."""

        def __init__(self, x, y, batch_size=BATCH):
            super().__init__()
            self.x, self.y, self.batch_size = x, y, batch_size

        def __len__(self):
            return math.ceil(len(self.x) / self.batch_size)

        def __getitem__(self, i):
            rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
            return self.x[rows], self.y[rows]

    class Steps(keras.callbacks.Callback):
        """Steps run per Keras epoch (train) and in total (test, predict)."""

        def __init__(self):
            super().__init__()
            self.train, self.test, self.predict = [], 0, 0

        def on_epoch_begin(self, epoch, logs=None):
            self.train.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.train[-1] += 1

        def on_test_batch_end(self, batch, logs=None):
            self.test += 1

        def on_predict_batch_end(self, batch, logs=None):
            self.predict += 1

    class EndAt(keras.callbacks.Callback):
        """Ends a fit at batch ``at`` of its first epoch: stop_training, an exception, or Ctrl-C."""

        def __init__(self, how, at):
            super().__init__()
            self.how, self.at = how, at

        def on_train_batch_end(self, batch, logs=None):
            if batch == self.at:
                if self.how == "stop_training":
                    self.model.stop_training = True
                elif self.how == "exception":
                    raise RuntimeError("a callback failed")
                else:
                    raise KeyboardInterrupt

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((WIDTH,), name="features"), keras.layers.Dense(1, activation="sigmoid")])
        m.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=["accuracy"])
        return m

    x, y = arrays(ROWS, 11)

    def loader(n=ROWS, seed=11, **options):
        xs, ys = arrays(n, seed)
        return sf.Loader(sf.ArraySource(x=xs, y=ys), BATCH, workers=2, **options)

    def calls(data, end=None):
        """fit cut short (or not), then evaluate, predict and fit on the same dataset object."""
        m, out = model(), {}
        if end is not None:
            try:
                m.fit(data, epochs=2, shuffle=False, verbose=0, callbacks=[EndAt(*end)])
            except (RuntimeError, KeyboardInterrupt) as error:
                out["ended_by"] = type(error).__name__
        steps = Steps()
        out["evaluate"] = m.evaluate(data, verbose=0, callbacks=[steps], return_dict=True)["loss"]
        predictions = m.predict(data, verbose=0, callbacks=[steps])
        history = m.fit(data, epochs=2, shuffle=False, verbose=0, callbacks=[steps])
        out.update(
            evaluate_steps=steps.test,
            predict_rows=int(len(predictions)),
            predict_steps=steps.predict,
            predict_sum=float(np.sum(predictions)),
            fit_steps=steps.train,
            fit_loss=history.history["loss"],
        )
        return out

    report = {"backend": backend}

    def check(name, fn):
        try:
            report[name] = fn()
        except BaseException:  # noqa: BLE001 - a Ctrl-C that escaped is a finding too
            report[name] = {"error": traceback.format_exc()}

    # -- 1. whatever way a fit ends, the next call behaves as on a fresh dataset --------------------
    def cut_short():
        out = {}
        for how in ("stop_training", "exception", "ctrl_c"):
            for at in (0, 2):
                source = loader()
                ours = calls(source.as_keras(), (how, at))
                source.close()
                out[f"{how}@{at}"] = {"steadyfeed": ours, "plain": calls(Plain(x, y), (how, at))}
        return out

    check("cut_short", cut_short)

    # -- 2. step limits -----------------------------------------------------------------------------
    def step_limits():
        out = {}

        def both(run):
            source = loader()
            try:
                ours = run(source.as_keras())
            finally:
                source.close()
            return {"steadyfeed": ours, "plain": run(Plain(x, y))}

        def fit_steps(steps_per_epoch, epochs=3):
            def run(data):
                steps = Steps()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    history = model().fit(
                        data,
                        epochs=epochs,
                        steps_per_epoch=steps_per_epoch,
                        shuffle=False,
                        verbose=0,
                        callbacks=[steps],
                    )
                return {"steps": steps.train, "loss": history.history["loss"]}

            return run

        out["steps_per_epoch_3"] = both(fit_steps(3))
        out["steps_per_epoch_6"] = both(fit_steps(6, epochs=2))

        def validation_steps(data):
            vx, vy = arrays(ROWS, 12)
            val_loader = sf.Loader(sf.ArraySource(x=vx, y=vy), BATCH)
            val = val_loader.as_keras() if isinstance(data, KerasDataset) else Plain(vx, vy)
            steps = Steps()
            history = model().fit(
                data, epochs=3, validation_data=val, validation_steps=2, shuffle=False, verbose=0, callbacks=[steps]
            )
            val_loader.close()
            return {"val_loss": history.history["val_loss"], "test_steps": steps.test}

        out["validation_steps_2"] = both(validation_steps)

        def evaluate_steps(data):
            m = model()
            first = m.evaluate(data, steps=2, verbose=0, return_dict=True)["loss"]
            whole = m.evaluate(data, verbose=0, return_dict=True)["loss"]
            return {
                "steps_2": first,
                "then_whole": whole,
                "predict_steps_2": int(len(m.predict(data, steps=2, verbose=0))),
            }

        out["evaluate_steps"] = both(evaluate_steps)

        def max_steps(data):
            keras.config.set_max_steps_per_epoch(2)
            try:
                return fit_steps(None, epochs=2)(data)
            finally:
                keras.config.set_max_steps_per_epoch(None)

        out["max_steps_per_epoch_2"] = both(max_steps)

        # as_keras(steps_per_epoch=3): every Keras epoch takes the next 3 batches, crossing loader epochs
        source = loader(with_ids=True, shuffle=True, seed=5)
        ids = []

        class Recording(KerasDataset):
            def on_batch(self, batch, epoch, index):
                ids.append((epoch, index, batch["id"].tolist()))

        steps = Steps()
        model().fit(Recording(source, steps_per_epoch=3), epochs=4, verbose=0, callbacks=[steps])
        source.close()
        out["crossing"] = {
            "steps": steps.train,
            "positions": [(e, i) for e, i, _ in ids],
            "epochs_exactly_once": all(
                sorted(i for e, _, batch in ids if e == epoch for i in batch) == list(range(ROWS))
                for epoch in (0, 1, 2)
            ),
        }
        return out

    check("step_limits", step_limits)

    # -- 3. padded batches: the numbers of the real rows --------------------------------------------
    def padded():
        px, py = arrays(PAD_ROWS, 13)
        source = sf.Loader(sf.ArraySource(x=px, y=py), BATCH, last_batch="pad")
        data, plain, m = source.as_keras(), Plain(px, py), model()
        out = {
            "evaluate": m.evaluate(data, verbose=0, return_dict=True),
            "evaluate_plain": m.evaluate(plain, verbose=0, return_dict=True),
            "predict_rows": int(len(m.predict(data, verbose=0))),
            "predict_equal": bool(np.allclose(m.predict(data, verbose=0), m.predict(plain, verbose=0), atol=1e-6)),
        }
        weights = {0: 1.0, 1: 3.0}
        out["class_weight_loss"] = (
            model().fit(data, epochs=1, class_weight=weights, shuffle=False, verbose=0).history["loss"]
        )
        out["class_weight_loss_plain"] = (
            model().fit(plain, epochs=1, class_weight=weights, shuffle=False, verbose=0).history["loss"]
        )
        source.close()
        return out

    check("padded", padded)

    # -- 4. two views of one loader ------------------------------------------------------------------
    def two_views():
        source = loader()
        train = source.as_keras()
        try:
            model().fit(train, validation_data=source.as_keras(), epochs=1, verbose=0)
            return {"raised": None}
        except Exception as error:  # noqa: BLE001
            return {"raised": type(error).__name__, "message": str(error)}
        finally:
            train.close()
            source.close()

    check("two_views", two_views)

    # -- 5. a failing sample: its own type, its fields, on every backend -----------------------------
    def failing_sample():
        source = sf.Loader(FailingSource(), 32, workers=2)
        data = source.as_keras()
        out = {}
        try:
            model().fit(data, epochs=1, verbose=0)
        except ValueError as error:  # what the worker raised: a ValueError
            out["caught_as_value_error"] = True
            out["raised"] = type(error).__name__
            out["message"] = str(error)
        except Exception as error:  # noqa: BLE001 - TF's own error type
            out["caught_as_value_error"] = False
            out["raised"] = type(error).__name__
            out["message"] = str(error)
        finally:
            source.close()
        kept = data.last_error
        out["last_error"] = {
            "is_sample_error": isinstance(kept, sf.SampleError),
            "is_value_error": isinstance(kept, ValueError),
            "sample_id": getattr(kept, "sample_id", None),
            "epoch": getattr(kept, "epoch", None),
            "attempts": getattr(kept, "attempts", None),
        }
        return out

    check("failing_sample", failing_sample)

    # -- 6. iterating the dataset outside fit uses the loader's workers -------------------------------
    def iteration():
        source = loader(inline_when_faster=False)
        data = source.as_keras()
        batches = [b for b in data]
        stats = source.stats()
        again = [b for b in data]
        source.close()
        return {
            "batches": len(batches),
            "again": len(again),
            "made_by_workers": stats["batches"] - stats["inline_batches"],
            "rows": int(sum(len(b[0]) for b in batches)),
        }

    check("iteration", iteration)
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
