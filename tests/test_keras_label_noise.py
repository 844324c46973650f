"""LabelNoiseMonitor in a real ``model.fit`` on the TensorFlow, JAX and PyTorch backends.

``keras_scripts/run_label_noise.py`` fits a small classifier (a Dropout layer included, so a
random draw taken by the monitor would show) on 490 samples with 49 planted label flips, twice:
with the monitor and without. The tests assert that the monitor changes nothing (the trained
batches are the loader's plan, batch for batch, and the weights are bit-identical) and that it
finds the flips. Times are in the report, never asserted.
"""

from __future__ import annotations

import keras_runs
import pytest

TEST_TIMEOUT = keras_runs.WAIT_TIMEOUT + 60
EPOCHS, N, FLIPS = 6, 490, 49


@pytest.fixture(scope="module", params=keras_runs.BACKENDS)
def report(request) -> dict:
    found = keras_runs.report(request, "label_noise", request.param)
    assert "error" not in found, f"{found['backend']}: the script raised:\n{found['error']}"
    return found


@pytest.mark.timeout(TEST_TIMEOUT)
def test_the_monitor_changes_neither_the_batches_nor_their_order_nor_the_weights(report):
    order = report["order"]
    assert sorted(order["planned"]) == [str(e) for e in range(EPOCHS)]
    for epoch, batches in order["planned"].items():
        assert sorted(i for b in batches for i in b) == list(range(N)), f"epoch {epoch}: not every sample once"
    assert order["with"] == order["planned"], "with the monitor, Keras trained other batches than the loader's plan"
    assert order["without"] == order["planned"]
    assert order["weights_with"] == order["weights_without"], "the monitor changed the training"


@pytest.mark.timeout(TEST_TIMEOUT)
def test_every_trained_sample_is_recorded_once_per_epoch_and_pad_rows_never(report):
    assert report["found"]["records"] == [EPOCHS] and report["found"]["ids"] == N
    batches = -(-N // 32)  # 16 a loader epoch, the last one of 10 rows (+ 22 pad rows under "pad")
    assert report["found"]["batches"] == EPOCHS * -(-batches // 8)  # every=8: one forward pass per 8 batches
    assert report["padded"] == {"records": [EPOCHS], "ids": N, "batches": EPOCHS * batches, "same_order": True}


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_loader_without_ids_is_refused_with_the_fix(report):
    assert "with_ids=True" in report["refused"]


@pytest.mark.timeout(TEST_TIMEOUT)
def test_the_monitor_finds_the_planted_flips(report):
    found = report["found"]  # measured: recall 0.96-0.98, estimate 0.099-0.105 on the three backends
    assert found["recall_at_k"] >= 0.8, found
    assert abs(found["noise_rate"]["estimate"] - FLIPS / N) < 0.04, found
    assert found["noise_rate"]["low"] <= FLIPS / N <= found["noise_rate"]["high"], found
