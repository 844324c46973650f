"""Data-quality checks: NaN/Inf, constant images, shape outliers, label drift; the Checked
wrapper makes a bad sample a DataError the Loader raises or quarantines."""

import pickle

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import ArraySource, DataError, Loader, SampleError, WeightedSampler
from steadyfeed.quality import (
    Checked,
    check_names,
    finite,
    label_classes,
    not_constant,
    outliers,
    sample_problems,
    total_variation,
)
from steadyfeed.tools.audit import audit

pytestmark = pytest.mark.timeout(60)

NAN_ID, BLANK_ID = 3, 7


def images(n=12) -> ArraySource:
    """Random float images; one with a NaN pixel, one blank."""
    x = np.random.default_rng(0).random((n, 4, 4, 3)).astype(np.float32)
    x[NAN_ID, 1, 2, 0] = np.nan
    x[BLANK_ID] = 0.5
    return ArraySource(x=x, y=np.arange(n) % 2)


# -- the per-sample checks -----------------------------------------------------------------------------
def test_finite_counts_nan_and_inf_in_float_arrays_only():
    assert finite(np.array([1.0, np.nan, np.inf, -np.inf])) == "1 NaN and 2 Inf of 4 values"
    assert finite(np.array([1.0, 2.0])) is None
    assert finite(np.array([1, 2])) is None  # integers cannot be NaN
    assert finite(np.array([1 + 1j, complex(np.nan, 0)])) == "1 NaN and 0 Inf of 2 values"


def test_not_constant_flags_blank_images_but_not_scalars():
    assert not_constant(np.zeros((8, 8, 3), np.uint8)) == "all 192 values are 0"
    assert not_constant(np.full((2, 2), 7.5)) == "all 4 values are 7.5"
    assert not_constant(np.arange(4)) is None
    assert not_constant(np.array(3)) is None  # a scalar label is not "constant"
    assert not_constant(np.array(["a", "a"])) is None  # strings are not measured


def test_check_names():
    assert check_names("all") == ("finite", "not_constant")
    assert check_names("finite,") == ("finite",)
    assert check_names(()) == ()
    with pytest.raises(ValueError, match="unknown check"):
        check_names(["finite", "sharp"])


def test_sample_problems_name_sample_key_and_check():
    source = images()
    (problem,) = sample_problems(NAN_ID, source[NAN_ID], check_names("all"))
    assert (problem.sample_id, problem.key, problem.check) == (NAN_ID, "x", "finite")
    assert str(problem) == f"sample {NAN_ID}, key 'x': finite: 1 NaN and 0 Inf of 48 values"
    blank = sample_problems(BLANK_ID, source[BLANK_ID], ["finite", "not_constant"])
    assert [p.check for p in blank] == ["not_constant"]
    assert sample_problems(BLANK_ID, source[BLANK_ID], ["not_constant"], keys=["y"]) == []


# -- Checked: a loader option ----------------------------------------------------------------------------
def test_checked_raises_a_data_error_naming_sample_key_and_check():
    checked = Checked(images(), checks="all")
    assert checked[0]["x"].shape == (4, 4, 3)
    with pytest.raises(DataError, match=r"sample 3, key 'x': finite: 1 NaN .*\(ArraySource row 3\)"):
        checked[NAN_ID]
    with pytest.raises(DataError, match="sample 7, key 'x': not_constant: all 48 values are 0.5"):
        checked[BLANK_ID]
    with Loader(checked, 4) as loader:
        with pytest.raises(SampleError) as caught:
            list(loader.epoch(0))
    assert caught.value.sample_id == NAN_ID and isinstance(caught.value.__cause__, DataError)


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_checked_samples_are_quarantined_under_skip_and_the_rest_delivered_once(workers, mode, no_leaks):
    with Loader(
        Checked(images(), checks=("finite", "not_constant")),
        4,
        shuffle=True,
        workers=workers,
        mode=mode,
        on_error="skip",
        with_ids=True,
        max_error_fraction=0.5,
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader.epoch(0)])
        report = loader.quarantine_report()
    assert sorted(ids.tolist()) == [i for i in range(12) if i not in (NAN_ID, BLANK_ID)]
    assert sorted(r["sample_id"] for r in report) == [NAN_ID, BLANK_ID]
    assert all(r["error_type"] == "DataError" for r in report)


def test_checked_shapes_and_delegation():
    source = ArraySource(x=np.zeros((3, 2)), y=np.arange(3))
    with pytest.raises(DataError, match=r"key 'x': shape: expected shape \(3,\), found \(2,\)"):
        Checked(source, checks=(), shapes={"x": (3,)})[0]
    checked = Checked(source, checks=())
    assert len(checked) == 3 and checked.locate(1) == "ArraySource row 1"
    assert [s["y"] for s in checked.read_many([2, 0])] == [2, 0]
    assert pickle.loads(pickle.dumps(checked)).checks == ()

    class Bare:  # no read_many, no locate: neither has the wrapper
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return {"x": np.ones(2)}

    assert getattr(Checked(Bare()), "read_many", None) is None and getattr(Checked(Bare()), "locate", None) is None


# -- per dataset: outliers and drift ------------------------------------------------------------------------
def test_outliers_are_the_items_unlike_the_most_common_value():
    found = outliers({"a.png": "RGB", "b.png": "RGB", "c.png": "L", "d.png": "RGB"})
    assert (found.common, found.common_count, found.items) == ("RGB", 3, ["c.png"])
    assert found.as_dict() == {"common": "RGB", "common_count": 3, "count": 1, "items": ["c.png"]}
    assert outliers({}) is None


def test_label_classes_accepts_categorical_labels_only():
    assert label_classes(np.array([2, 0, 2])) == [2, 0, 2]
    assert label_classes(np.array([b"cat", b"dog"])) == ["cat", "dog"]
    assert label_classes(np.eye(3)[[2, 0]]) == [2, 0]  # one-hot rows
    assert label_classes(np.array([0.5, 1.5])) is None  # regression targets
    assert label_classes(np.array([[0.2, 0.8]])) is None  # soft labels


def test_total_variation():
    assert total_variation({0: 5, 1: 5}, {0: 50, 1: 50}) == 0.0
    assert total_variation({0: 3}, {1: 3}) == 1.0
    assert total_variation({0: 9, 1: 1}, {0: 5, 1: 5}) == pytest.approx(0.4)


class AlternatingClasses(WeightedSampler):
    """Even epochs draw class 0 only, odd epochs class 1 only: drift between epochs by design."""

    def __init__(self, labels):
        super().__init__(np.ones(len(labels)))
        self.labels = np.asarray(labels)

    def epoch_order(self, num_items, seed, epoch):
        return np.flatnonzero(self.labels == epoch % 2).astype(np.int64)


def int_labelled(n, labels) -> ArraySource:
    return ArraySource(x=np.arange(n * 2, dtype=np.float32).reshape(n, 2), y=np.asarray(labels, np.int64))


def test_audit_reports_label_drift_between_epochs():
    labels = np.arange(20) % 2
    with Loader(int_labelled(20, labels), 4, sampler=AlternatingClasses(labels)) as loader:
        report = audit(loader, settings=[(0, "thread")])
    assert [c.name for c in report.failed] == ["label_drift_epochs"]
    assert report.failed[0].details["distances"] == {1: 1.0}
    with Loader(int_labelled(20, labels), 4, shuffle=True) as loader:
        assert audit(loader, settings=[(0, "thread")]).passed


def test_label_drift_is_checked_for_labels_held_as_a_column_and_a_skip_says_why():
    labels = (np.arange(20) % 2).reshape(20, 1)  # (N, 1), as Keras often holds class ids
    assert label_classes(labels) == (np.arange(20) % 2).tolist()
    with Loader(int_labelled(20, labels), 4, sampler=AlternatingClasses(labels[:, 0])) as loader:
        drift = {c.name: c for c in audit(loader, settings=[(0, "thread")]).checks}["label_drift_epochs"]
    assert drift.status == "fail" and drift.details["distances"] == {1: 1.0}
    with Loader(int_labelled(20, labels), 4) as loader:
        skipped = {c.name: c for c in audit(loader, epochs=1, settings=[(0, "thread")]).checks}["label_drift_epochs"]
    assert (skipped.status, skipped.summary) == ("skip", "needs 2+ completed epochs, 1 completed")
    floats = ArraySource(x=np.zeros((8, 2), np.float32), y=np.linspace(0, 1, 8))
    with Loader(floats, 4) as loader:
        skipped = {c.name: c for c in audit(loader, settings=[(0, "thread")]).checks}["label_drift_epochs"]
    assert skipped.status == "skip" and "not categorical" in skipped.summary


def test_audit_reports_label_drift_between_splits_and_quality_problems():
    train = int_labelled(20, np.arange(20) % 2)
    skewed = ArraySource(x=np.arange(100, 120, dtype=np.float32).reshape(10, 2), y=np.r_[np.zeros(9), 1].astype(int))
    with Loader(train, 4) as a, Loader(skewed, 4) as b:
        report = audit(a, epochs=1, settings=[(0, "thread")], against=b)
    drift = {c.name: c for c in report.checks}["label_drift_splits"]
    assert drift.status == "fail" and drift.details["distance"] == pytest.approx(0.4)
    with Loader(images(), 4) as loader:
        report = audit(loader, epochs=1, settings=[(0, "thread")], checks="all")
    bad = {c.name: c for c in report.failed}
    assert set(bad) == {"quality:finite", "quality:not_constant"}
    assert [p["sample_id"] for p in bad["quality:finite"].details["problems"]] == [NAN_ID]
    assert [p["sample_id"] for p in bad["quality:not_constant"].details["problems"]] == [BLANK_ID]


def test_paired_source_passes_every_check():
    with Loader(Checked(paired_source(30), checks="finite"), 8) as loader:
        assert sum(len(b["x"]) for b in loader.epoch(0)) == 30
