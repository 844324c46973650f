"""LabelNoiseMonitor during a real ``model.fit`` on one backend (KERAS_BACKEND, set by the caller).

Prints one line ``REPORT {json}`` that tests/test_keras_label_noise.py parses: the ids of every
trained batch with and without the monitor and as the loader plans them, the weights' digests of
both fits, what the monitor found about the planted flips, and the times (reported, never
asserted). Workers are threads, so nothing re-imports this file.
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback

import numpy as np

import steadyfeed as sf

N, CLASSES, DIM, BATCH, EPOCHS, RATE = 490, 3, 6, 32, 6, 0.1


def data():
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=2.5, size=(CLASSES, DIM))
    truth = rng.integers(0, CLASSES, N)
    x = (centers[truth] + rng.normal(size=(N, DIM))).astype(np.float32)
    flipped = np.sort(rng.choice(N, int(RATE * N), replace=False))
    y = truth.copy()
    y[flipped] = (truth[flipped] + rng.integers(1, CLASSES, len(flipped))) % CLASSES
    return x, y.astype(np.int64), flipped


def main() -> None:
    import keras

    from steadyfeed.keras import KerasDataset, LabelNoiseMonitor

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    x, y, flipped = data()

    class Recording(KerasDataset):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handed = {}

        def on_batch(self, batch, epoch, index):
            self.handed.setdefault(str(epoch), []).append(batch["id"].tolist())

    def loader(**kw):
        return sf.Loader(sf.ArraySource(x=x, y=y), BATCH, shuffle=True, seed=3, workers=2, **{"with_ids": True, **kw})

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential(
            [
                keras.Input((DIM,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(0.2),
                keras.layers.Dense(CLASSES),
            ]
        )
        m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def digest(m):
        h = hashlib.sha256()
        for w in m.get_weights():
            h.update(np.ascontiguousarray(w).tobytes())
        return h.hexdigest()

    def fit(monitored: bool, every: int = 8, **loader_kw):
        with loader(**loader_kw) as train:
            dataset = Recording(train)
            callbacks = [LabelNoiseMonitor(train, every=every)] if monitored else []
            m = model()
            t0 = time.perf_counter()
            m.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks)
            seconds = time.perf_counter() - t0
            dataset.close()
        return m, dataset.handed, seconds, (callbacks[0] if callbacks else None)

    def planned(**loader_kw):
        with loader(**loader_kw) as train:
            return {str(e): [b["id"].tolist() for b in train.epoch(e)] for e in range(EPOCHS)}

    report = {"backend": backend}
    try:
        plain, plain_ids, plain_s, _ = fit(False)
        watched, watched_ids, watched_s, monitor = fit(True)
        found = monitor.findings()
        signals = monitor.recorder.signals()
        k = len(flipped)
        top = [s["id"] for s in found["suspects"]][:k]
        report["order"] = {
            "planned": planned(),
            "without": plain_ids,
            "with": watched_ids,
            "weights_without": digest(plain),
            "weights_with": digest(watched),
        }
        report["found"] = {
            "recall_at_k": len(set(top) & set(flipped.tolist())) / k,
            "flagged": found["flagged"],
            "noise_rate": found["noise_rate"],
            "records": sorted(set(signals["records"].tolist())),
            "ids": len(signals["id"]),
            "batches": monitor.recorder.batches,
        }
        report["cost"] = {"fit_without_s": plain_s, "fit_with_s": watched_s, "monitor_s": monitor.seconds}
        # a padded last batch: pad rows are not samples, and are not recorded
        _, padded_ids, _, padded = fit(True, every=1, last_batch="pad")
        report["padded"] = {
            "records": sorted(set(padded.recorder.signals()["records"].tolist())),
            "ids": len(padded.recorder.signals()["id"]),
            "batches": padded.recorder.batches,
            "same_order": padded_ids == planned(last_batch="pad"),
        }
        try:
            with loader(with_ids=False) as no_ids:
                LabelNoiseMonitor(no_ids)
            report["refused"] = None
        except ValueError as exc:
            report["refused"] = str(exc)
    except Exception:
        report["error"] = traceback.format_exc()
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
