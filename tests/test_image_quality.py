"""Image quality (issue 17, item 2): blur, exposure, contrast, thresholds from the data's own
robust statistics, in Checked (its workers), audit (the scan's workers) and inspect."""

import json

import images_made as made
import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed import Checked, Loader
from steadyfeed.diagnostics import image_quality as iq
from steadyfeed.tools.audit import audit
from steadyfeed.tools.cli import main

pytest.importorskip("PIL")

DAMAGE = {"blur": (3, 17, 41), "underexposed": (8, 30), "overexposed": (12,), "low_contrast": (22, 50)}
MAKERS = {"blur": made.blurred, "underexposed": made.dark, "overexposed": made.blown_out, "low_contrast": made.flat}


def damaged_scenes(n=60):
    """``n`` scenes, some damaged as DAMAGE says (by id)."""
    images = [made.scene(seed) for seed in range(n)]
    for check, ids in DAMAGE.items():
        for i in ids:
            images[i] = MAKERS[check](images[i])
    return images


def tree(tmp_path, n=60):
    """An image tree of two classes (ids 0..29 'cats', 30..59 'dogs', ImageFolder's order)."""
    images = damaged_scenes(n)
    made.write_tree(tmp_path / "photos", {"cats": images[: n // 2], "dogs": images[n // 2 :]})
    return tmp_path / "photos"


def flagged_ids(section, check):
    return {f["id"] for f in section["checks"][check]["flagged"]}


def test_each_damage_moves_its_score_the_bad_way():
    image = made.scene(1)
    base = iq.scores(np.asarray(image))
    for check, make in MAKERS.items():
        got = iq.scores(np.asarray(make(image)))
        worse = got[check] < base[check] if iq.CHECKS[check].low_is_bad else got[check] > base[check]
        assert worse[0], (check, got[check], base[check])


def test_the_scores_match_a_plain_reference_and_batches_match_single_images():
    from scipy import ndimage

    images = np.stack([np.asarray(made.scene(s)) for s in range(5)])
    batch = iq.scores(images)
    for j, image in enumerate(images):
        g = (image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])) / 255
        laplacian = ndimage.convolve(g, np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]]), mode="constant")[1:-1, 1:-1]
        assert batch["blur"][j] == pytest.approx(laplacian.var(), rel=1e-4)
        assert batch["low_contrast"][j] == pytest.approx(g.std(), rel=1e-4)
        assert batch["underexposed"][j] == np.mean(g <= 4 / 255 + 1e-7)
        single = iq.scores(image)
        assert {k: v[0] for k, v in single.items()} == {k: v[j] for k, v in batch.items()}
    luma = images[0].astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    grey16 = np.round(luma * 257).astype(np.uint16)  # another dtype, one channel: scaled by its maximum
    assert iq.scores(grey16)["low_contrast"][0] == pytest.approx(iq.scores(images[0])["low_contrast"][0], rel=0.02)


def test_robust_thresholds_ignore_the_outliers_they_find():
    rng = np.random.default_rng(0)
    values = np.exp(rng.normal(-4, 0.3, 1000))
    clean = iq.robust_threshold("blur", values)
    spoiled = iq.robust_threshold("blur", np.concatenate([values, np.full(30, 1e-7)]))
    assert spoiled == pytest.approx(clean, rel=0.1)  # 3% of awful images barely move it
    assert iq.robust_threshold("underexposed", np.zeros(100)) == iq.MIN_CLIPPED  # MAD 0: the floor
    assert iq.robust_threshold("low_contrast", np.full(10, 0.2)) == 0.2  # identical: none is beyond it
    assert not iq.flagged("low_contrast", np.full(10, 0.2), 0.2).any()


@pytest.mark.timeout(300)
def test_audit_flags_the_damaged_images_with_a_per_class_breakdown(tmp_path, no_leaks):
    root = tree(tmp_path)
    loader = Loader(sf.ImageFolder(root), 8)
    report = audit(loader, epochs=1, settings=((2, "process"),), checks=("image",))  # scored in worker processes
    section = report.findings["quality"]
    damaged = {i for ids in DAMAGE.values() for i in ids}
    every = set().union(*(flagged_ids(section, c) for c in iq.CHECKS))
    assert every == damaged  # nothing clean is flagged, nothing damaged is missed
    assert flagged_ids(section, "blur") >= set(DAMAGE["blur"])
    assert flagged_ids(section, "underexposed") == set(DAMAGE["underexposed"])
    assert flagged_ids(section, "overexposed") == set(DAMAGE["overexposed"])
    assert flagged_ids(section, "low_contrast") >= set(DAMAGE["low_contrast"])
    for check in iq.CHECKS:
        assert section["checks"][check]["source"] == "robust" and section["checks"][check]["scored"] == 60
        for f in section["checks"][check]["flagged"]:
            assert f["label"] == (0 if f["id"] < 30 else 1) and f["file"].endswith(".png")
    assert section["per_class"]["0"]["underexposed"] == 1 and section["per_class"]["1"]["underexposed"] == 1
    assert section["per_class"]["0"]["overexposed"] == 1 and section["per_class"]["1"]["overexposed"] == 0
    failed = {c.name for c in report.failed}
    assert failed == {f"quality:{c}" for c in iq.CHECKS}
    json.dumps(report.as_dict())  # JSON-able as the report renders it


def test_given_thresholds_replace_the_robust_ones(tmp_path):
    images = np.stack([np.asarray(made.scene(s)) for s in range(20)])
    loader = Loader(sf.ArraySource(x=images, y=np.arange(20) % 2), 4)
    report = audit(
        loader, epochs=1, settings=((0, "thread"),), checks=("blur", "low_contrast"), thresholds={"blur": 1.0}
    )
    section = report.findings["quality"]["checks"]
    assert section["blur"]["source"] == "given" and section["blur"]["threshold"] == 1.0
    assert len(section["blur"]["flagged"]) == 20  # every scene is blurrier than an absurd threshold
    assert section["low_contrast"]["source"] == "robust" and not section["low_contrast"]["flagged"]
    assert set(report.findings["quality"]["per_class"]) == {"0", "1"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_checked_quarantines_the_damaged_images_in_its_workers(tmp_path, workers, mode, no_leaks):
    root = tree(tmp_path)
    checked = Checked(sf.ImageFolder(root), checks="image", calibrate=60)
    assert set(checked.thresholds) == set(iq.CHECKS)
    with Loader(
        checked, 8, on_error="skip", max_error_fraction=0.5, with_ids=True, workers=workers, mode=mode
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        quarantined = {e["sample_id"] for e in loader.quarantine_report()}
    damaged = {i for v in DAMAGE.values() for i in v}
    assert quarantined == damaged
    np.testing.assert_array_equal(np.sort(ids), np.setdiff1d(np.arange(60), sorted(damaged)))
    entry = next(e for e in loader.quarantine_report() if e["sample_id"] == 12)
    assert "overexposed" in entry["message"] and "threshold" in entry["message"]


def test_checked_with_thresholds_reads_nothing_to_calibrate():
    class Counting:
        reads = 0

        def __len__(self):
            return 10

        def __getitem__(self, i):
            Counting.reads += 1
            return {"x": np.asarray(made.scene(i))}

    given = {"blur": 0.001, "low_contrast": 0.05}
    checked = Checked(Counting(), checks=("blur", "low_contrast"), thresholds=given)
    assert checked.thresholds == given and Counting.reads == 0
    assert Checked(Counting(), checks=("finite",)).thresholds == {}


def test_inspect_an_image_tree_names_the_damaged_files(tmp_path, capsys):
    root = tree(tmp_path)
    code = main(["inspect", str(root), "--checks", "image", "--workers", "2", "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["passed"]
    section = report["findings"]["quality"]
    flagged = {f["file"] for c in section["checks"].values() for f in c["flagged"]}
    expected = {f"{'cats' if i < 30 else 'dogs'}/{i % 30:03d}.png" for v in DAMAGE.values() for i in v}
    assert flagged == expected
    assert {p["sample_id"] for p in report["problems"]} == expected
    assert set(section["per_class"]) == {"cats", "dogs"}


def test_unknown_checks_and_bad_thresholds_are_usage_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown check"):
        Checked(sf.ArraySource(x=np.zeros((3, 8, 8))), checks=("sharpness",))
    np.save(tmp_path / "x.npy", np.zeros((4, 8, 8), np.float32))
    assert main(["audit", "--npy", str(tmp_path / "x.npy"), "--checks", "image", "--threshold", "sharp=1"]) == 2
    assert "--threshold takes CHECK=VALUE" in capsys.readouterr().err


def test_inspect_a_loader_judges_its_images_too():
    from steadyfeed.tools.inspection import inspect_loader

    images = [np.asarray(made.scene(s)) for s in range(30)]
    images[7] = np.asarray(made.dark(made.scene(7)))
    loader = Loader(sf.ArraySource(x=np.stack(images), y=np.arange(30) % 3), 8)
    report = inspect_loader(loader, checks=("underexposed",))
    assert not report.passed and [(p.sample_id, p.check) for p in report.problems] == [(7, "underexposed")]
    assert report.as_dict()["findings"]["quality"]["per_class"] == {"1": {"underexposed": 1}}
