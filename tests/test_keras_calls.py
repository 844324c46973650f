"""Keras as people call it, on TensorFlow, JAX and PyTorch, each compared with a plain PyDataset.

``keras_scripts/run_calls.py`` runs once per backend in its own subprocess and reports what
happened; each test asserts one promise of ``steadyfeed.keras.KerasDataset`` on it:

* a fit ended by ``stop_training``, an exception or Ctrl-C (at batch 0 and 2) leaves the dataset
  as good as new: evaluate, predict and the next fit run the same steps, rows and losses as a
  plain ``keras.utils.PyDataset`` over the same arrays;
* ``steps_per_epoch`` (smaller and larger than an epoch), ``validation_steps``, ``steps=`` and
  ``max_steps_per_epoch`` behave as for that PyDataset; ``as_keras(steps_per_epoch=N)`` crosses
  loader epochs, each exactly once;
* ``last_batch="pad"`` gives the numbers of the real rows, and ``class_weight`` works;
* two views of one loader are refused; a failing sample is caught as its own type.
"""

from __future__ import annotations

import keras_runs
import pytest

pytestmark = pytest.mark.timeout(keras_runs.WAIT_TIMEOUT + 60)
LOSS_TOLERANCE = 1e-6
CUT_SHORT = [f"{how}@{at}" for how in ("stop_training", "exception", "ctrl_c") for at in (0, 2)]


@pytest.fixture(scope="module", params=keras_runs.BACKENDS)
def report(request) -> dict:
    return keras_runs.report(request, "calls", request.param)


def part(report: dict, name: str):
    value = report[name]
    assert not (isinstance(value, dict) and "error" in value), f"{report['backend']}: {name} raised:\n{value['error']}"
    return value


def assert_like_plain(case: dict, name: str) -> None:
    """The same steps and rows as the plain PyDataset, and losses within LOSS_TOLERANCE."""
    ours, plain = case["steadyfeed"], case["plain"]
    assert ours.keys() == plain.keys(), name
    for key, value in plain.items():
        if isinstance(value, float):
            assert abs(ours[key] - value) <= LOSS_TOLERANCE, (name, key, ours[key], value)
        elif isinstance(value, list) and value and isinstance(value[0], float):
            assert len(ours[key]) == len(value) and all(
                abs(a - b) <= LOSS_TOLERANCE for a, b in zip(ours[key], value)
            ), (name, key, ours[key], value)
        else:
            assert ours[key] == value, (name, key, ours[key], value)


@pytest.mark.parametrize("ending", CUT_SHORT)
def test_after_a_fit_cut_short_the_dataset_behaves_as_a_fresh_one(report, ending):
    case = part(report, "cut_short")[ending]
    assert_like_plain(case, ending)
    ours = case["steadyfeed"]
    assert (ours["evaluate_steps"], ours["predict_rows"], ours["fit_steps"]) == (4, 64, [4, 4])
    if not ending.startswith("stop_training"):
        assert ours["ended_by"] == {"exception": "RuntimeError", "ctrl_c": "KeyboardInterrupt"}[ending.split("@")[0]]


@pytest.mark.parametrize(
    "case", ["steps_per_epoch_3", "steps_per_epoch_6", "validation_steps_2", "evaluate_steps", "max_steps_per_epoch_2"]
)
def test_step_limits_behave_as_for_a_plain_pydataset(report, case):
    limits = part(report, "step_limits")
    assert_like_plain(limits[case], case)
    expected = {
        "steps_per_epoch_3": {"steps": [3, 1, 3]},
        "steps_per_epoch_6": {"steps": [4, 4]},
        "max_steps_per_epoch_2": {"steps": [2, 2]},
        "validation_steps_2": {"test_steps": 6},
        "evaluate_steps": {"predict_steps_2": 32},
    }[case]
    assert {k: limits[case]["steadyfeed"][k] for k in expected} == expected


def test_steps_given_to_as_keras_cross_loader_epochs_each_exactly_once(report):
    crossing = part(report, "step_limits")["crossing"]
    assert crossing["steps"] == [3, 3, 3, 3]
    assert crossing["positions"] == [[e, i] for e in range(3) for i in range(4)]
    assert crossing["epochs_exactly_once"]


def test_padded_batches_give_the_numbers_of_the_real_rows(report):
    padded = part(report, "padded")
    assert abs(padded["evaluate"]["loss"] - padded["evaluate_plain"]["loss"]) <= LOSS_TOLERANCE
    assert abs(padded["evaluate"]["accuracy"] - padded["evaluate_plain"]["accuracy"]) <= LOSS_TOLERANCE
    assert padded["predict_rows"] == 70 and padded["predict_equal"]
    assert abs(padded["class_weight_loss"][0] - padded["class_weight_loss_plain"][0]) <= LOSS_TOLERANCE


def test_two_views_of_one_loader_are_refused_before_training(report):
    refused = part(report, "two_views")
    assert refused["raised"] == "ValueError"
    assert "already has a KerasDataset" in refused["message"] and "loader of its own" in refused["message"]


def test_a_failing_sample_is_caught_as_its_own_type_with_its_fields(report):
    failed = part(report, "failing_sample")
    assert failed["last_error"] == {
        "is_sample_error": True,
        "is_value_error": True,
        "sample_id": 77,
        "epoch": 0,
        "attempts": 1,
    }
    assert "sample 77" in failed["message"] and "corrupt sample 77" in failed["message"]
    if report["backend"] == "tensorflow":  # tf.data re-raises it as its own type: the message says where it is
        assert failed["raised"] == "InvalidArgumentError" and "is this KerasDataset's last_error" in failed["message"]
    else:
        assert failed["caught_as_value_error"] and failed["raised"] == "SampleError[ValueError]"


def test_iterating_the_dataset_outside_fit_uses_the_loaders_workers(report):
    assert part(report, "iteration") == {"batches": 4, "again": 4, "made_by_workers": 4, "rows": 64}
