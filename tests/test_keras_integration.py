"""steadyfeed under Keras 3 on the TensorFlow, JAX and PyTorch backends.

Each backend runs once, in its own subprocess (``KERAS_BACKEND`` is fixed per process):
``keras_scripts/run_backend.py`` trains small models through steadyfeed and prints one JSON
report; the tests below each assert one promise on it. A backend that is not installed is
skipped with the reason. The framework-free parts are tested in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import keras_runs
import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed.config import PREFETCH_PER_WORKER
from steadyfeed.errors import DataError
from steadyfeed.execution.grouping import MAX_BATCHES
from steadyfeed.integration.distributed import shard_from_jax, shard_from_tf_input_context
from steadyfeed.integration.layout import BatchLayout
from steadyfeed.integration.shapes import fixed_batch_size

TEST_TIMEOUT = keras_runs.WAIT_TIMEOUT + 60
EPOCHS, STEPS = 3, 16  # run_backend.py: 500 samples, batches of 32
FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")


@pytest.fixture(scope="module", params=keras_runs.BACKENDS)
def report(request) -> dict:
    return keras_runs.report(request, "backend", request.param)


def part(report: dict, name: str) -> dict:
    value = report[name]
    assert not (isinstance(value, dict) and "error" in value), f"{report['backend']}: {name} raised:\n{value['error']}"
    return value


# -- end to end, per backend ---------------------------------------------------------------
@pytest.mark.timeout(TEST_TIMEOUT)
def test_fit_learns_with_pairs_intact_every_batch_once_in_every_mode(report):
    for mode in ("thread", "process", "inline"):
        run = part(report, "modes")[mode]
        assert run["exactly_once"], f"{mode}: an epoch did not train every sample exactly once"
        assert run["steps"] == [STEPS] * EPOCHS and run["handed"] == [STEPS] * EPOCHS
        assert run["final_val_loss"] < 0.5 * run["initial_val_loss"], run
        assert run["final_val_accuracy"] > 0.9, run


@pytest.mark.timeout(TEST_TIMEOUT)
def test_shuffled_labels_do_not_reach_the_same_accuracy(report):
    learned = part(report, "modes")["thread"]["final_val_accuracy"]
    shuffled = part(report, "shuffled_labels")["final_val_accuracy"]
    assert shuffled < 0.7 and learned - shuffled > 0.25, (learned, shuffled)


@pytest.mark.timeout(TEST_TIMEOUT)
def test_same_seed_gives_the_same_weights_for_threads_processes_and_inline(report):
    assert part(report, "modes")["same_weights_all_modes"]


@pytest.mark.timeout(TEST_TIMEOUT)
def test_killed_fit_resumes_with_the_same_trained_batches_and_weights(report):
    resume = part(report, "resume")
    assert resume["crashed_by"] == "simulated kill"
    assert resume["crashed_steps"] == {"0": STEPS, "1": 11}
    # LoaderCheckpoint and BackupAndRestore(save_freq=5) saved at the same step: epoch 1, 9 batches trained
    assert resume["saved"] == {"epoch": 1, "next_batch": 9}
    assert resume["keras_saved"] == {"epoch": 1, "batch": 8}
    assert resume["restored"]
    assert resume["resumed_steps"] == {"1": STEPS - 9, "2": STEPS}  # the resumed epoch ends early, the next is whole
    assert resume["same_trained_batches"]
    assert resume["same_weights"]
    assert resume["ran_out_warnings"] == 0
    assert resume["loader_file_deleted"]


@pytest.mark.timeout(TEST_TIMEOUT)
def test_loader_monitor_values_are_in_history(report):
    history = part(report, "modes")["thread"]["history"]
    assert sorted(history) == [
        "data_from_pack",
        "data_quarantined",
        "data_queue_fill",
        "data_samples_per_sec",
        "data_wait_fraction",
        "data_wait_ms_per_step",
    ]
    assert all(len(values) == EPOCHS for values in history.values())
    assert all(v > 0 for v in history["data_samples_per_sec"])
    assert all(0 <= v < 5 for v in history["data_wait_fraction"])
    assert all(0 <= v < 1000 for v in history["data_wait_ms_per_step"])
    # the default window of 2 workers, counted in tasks of up to MAX_BATCHES batches (grouping.py)
    assert all(0 <= v <= 2 * PREFETCH_PER_WORKER * MAX_BATCHES for v in history["data_queue_fill"])
    assert history["data_quarantined"] == [0.0] * EPOCHS
    assert history["data_from_pack"] == [0.0] * EPOCHS  # no pack_to: every batch from the source
    # 20 batches, 640 samples, 0.5 s of waiting in 4 s; fill 90 - 20 over 20 batches
    assert part(report, "monitor_figures") == {
        "data_samples_per_sec": 160.0,
        "data_wait_fraction": 0.125,
        "data_wait_ms_per_step": 25.0,
        "data_queue_fill": 3.5,
        "data_quarantined": 2.0,
        "data_from_pack": 0.0,
    }


@pytest.mark.timeout(TEST_TIMEOUT)
def test_padded_rows_never_reach_keras_and_predict_gives_one_row_per_sample(report):
    pad = part(report, "pad_and_predict")
    assert abs(pad["accuracy_plain"] - pad["accuracy_padded"]) < 1e-6, pad
    assert pad["predict_rows"] == pad["predict_expected"]
    assert np.isfinite(pad["pad_fit_loss"])


@pytest.mark.timeout(TEST_TIMEOUT)
def test_errors_before_training_name_the_key_the_input_and_both_shapes(report):
    errors = part(report, "errors")
    shape = errors["shape"]
    assert shape["raised"] == "InputMismatch"
    for needle in ("'x'", "'features'", "(32, 8)", "(None, 5)"):
        assert needle in shape["message"], shape["message"]
    assert errors["missing_key"]["raised"] == "DataError"
    assert "'pixels'" in errors["missing_key"]["message"] and "['x', 'y']" in errors["missing_key"]["message"]
    assert errors["dict_unknown_input"]["raised"] == "InputMismatch"
    assert "'rite'" in errors["dict_unknown_input"]["message"]


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_failing_sample_stops_fit_naming_it(report):
    failed = part(report, "sample_error")
    # TF re-raises from tf.data as its own type; elsewhere the SampleError is also a ValueError
    expected = "InvalidArgumentError" if report["backend"] == "tensorflow" else "SampleError[ValueError]"
    assert failed["raised"] == expected and failed["names_sample"], failed
    assert failed["last_error"] == "SampleError[ValueError]" and failed["last_error_id"] == 77


@pytest.mark.timeout(TEST_TIMEOUT)
def test_multi_input_model_takes_a_dict_of_keys(report):
    loss = part(report, "multi_input")["loss"]
    assert loss[-1] < loss[0]


@pytest.mark.timeout(TEST_TIMEOUT)
def test_backend_bridges(report):
    extras = part(report, "extras")
    backend = report["backend"]
    if backend == "tensorflow":
        assert extras["signature"] == {
            "x": ["float32", [32, 8]],
            "y": ["float32", [32, 1]],
            "id": ["int64", [32]],
            "mask": ["float32", [32]],
        }
        assert extras["signature_keras"] == (
            "(TensorSpec(shape=(None, 8), dtype=tf.float32, name=None), "
            "TensorSpec(shape=(None, 1), dtype=tf.float32, name=None))"
        )
        assert extras["distributed_exactly_once"] and extras["from_function_exactly_once"]
        assert extras["cursor_after_one_pass"] == 1
        assert extras["shard_of_context"] == {"shard_index": 1, "shard_count": 4}
        assert extras["strategy_fit_exactly_once"] and extras["strategy_fit_batches"] == 2 * STEPS
    elif backend == "torch":
        assert extras["types"] == ["Tensor"] and extras["len"] == STEPS
        assert extras["dtypes"] == {"x": "torch.float32", "y": "torch.float32", "id": "torch.int64"}
        assert extras["epoch_exactly_once"]
        assert "steadyfeed's workers are the workers" in extras["torch_workers"]
        assert extras["shard_env"] == {"shard_index": 2, "shard_count": 4}
        # Keras's own conversion copies each numpy batch between steps: steadyfeed hands it tensors
        assert extras["keras_step_types"] == ["Tensor", "Tensor"] and extras["keras_zero_copy"]
        # uint32, read-only, big-endian, negative strides: Keras's own path
        assert extras["keras_kept_numpy"] == ["ndarray"] * 4
    else:
        assert extras["device_put_types"] == ["ArrayImpl"] and extras["device_put_equal"]
        assert extras["shard"] == {"shard_index": 0, "shard_count": 1}


@pytest.mark.timeout(TEST_TIMEOUT)
def test_no_worker_process_or_thread_outlives_its_loader(report):
    assert part(report, "leaks") == {"children": [], "threads": []}


# -- framework-free, in this process ----------------------------------------------------------
@pytest.mark.timeout(60)
def test_import_steadyfeed_imports_no_framework():
    code = (
        "import json, sys, steadyfeed, steadyfeed.integration.layout, steadyfeed.integration.distributed, "
        "steadyfeed.integration.shapes, steadyfeed.integration.epochs\n"
        f"print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_batch_layout_arranges_keys_and_makes_the_mask_the_weight():
    batch = {
        "a": np.ones((3, 2)),
        "b": np.zeros((3, 1)),
        "y": np.arange(3.0),
        "w": np.array([1.0, 2.0, 3.0], np.float32),
        "mask": np.array([1.0, 1.0, 0.0], np.float32),
    }
    x, y, w = BatchLayout("a", "y").to_keras(batch)
    assert x is batch["a"] and y is batch["y"] and w is batch["mask"]
    x, _, _ = BatchLayout(("a", "b"), "y").to_keras(batch)
    assert isinstance(x, tuple) and x[1] is batch["b"]
    x, _, _ = BatchLayout({"left": "a", "right": "b"}, "y").to_keras(batch)
    assert set(x) == {"left", "right"}
    _, _, w = BatchLayout("a", "y", sample_weight="w").to_keras(batch)
    np.testing.assert_array_equal(w, [1.0, 2.0, 0.0])
    assert len(BatchLayout("a", None).to_keras(batch)) == 1  # predict: x only
    with pytest.raises(DataError, match="'nope'.*\\['a', 'b', 'mask', 'w', 'y'\\]"):
        BatchLayout("nope").to_keras(batch)
    with pytest.raises(TypeError):
        BatchLayout(3)


def test_fixed_batch_size_only_where_every_batch_is_full():
    src = sf.ArraySource(x=np.zeros((10, 2)))
    assert fixed_batch_size(sf.Loader(src, 4, last_batch="pad")) == 4
    assert fixed_batch_size(sf.Loader(src, 4, last_batch="drop")) == 4
    assert fixed_batch_size(sf.Loader(src, 4, last_batch="drop", on_error="skip")) is None
    assert fixed_batch_size(sf.Loader(src, 4)) is None


def test_shard_helpers(monkeypatch):
    context = types.SimpleNamespace(input_pipeline_id=1, num_input_pipelines=4)
    assert shard_from_tf_input_context(context) == {"shard_index": 1, "shard_count": 4}
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(process_index=lambda: 3, process_count=lambda: 8))
    assert shard_from_jax() == {"shard_index": 3, "shard_count": 8}
    with pytest.raises(ValueError, match="shard 4 of 4"):
        shard_from_tf_input_context(types.SimpleNamespace(input_pipeline_id=4, num_input_pipelines=4))
    sharded = sf.Loader(sf.ArraySource(x=np.arange(10.0)), 2, last_batch="pad", **shard_from_jax())
    assert len(sharded) == 1


def test_a_dict_x_without_y_is_the_batch_itself():
    batch = {"a": np.ones((3, 2)), "b": np.zeros((3, 1))}
    whole = BatchLayout({"a": "a", "b": "b"}, None).to_keras(batch)  # Keras reads a dict batch as the inputs
    assert isinstance(whole, dict) and whole["a"] is batch["a"]
