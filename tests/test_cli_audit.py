"""``steadyfeed audit`` passes a good loader and names each fault of the loaders in
``cli_specs/audit_cases.py``: a dropped sample, a duplicated one, swapped labels, pairs mixed
by a batched read, worker-count-dependent batches, and validation samples leaked into training."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import FaultySource, paired_source

from steadyfeed import ArraySource, Loader, WeightedSampler
from steadyfeed.tools.audit import audit, expected_count, parse_settings
from steadyfeed.tools.cli import main

pytestmark = pytest.mark.timeout(120)

CASES = Path(__file__).parent / "cli_specs" / "audit_cases.py"
THREADS = ["--no-progress", "--settings", "0,2"]  # process mode is covered once, by the good loader


def spec(name: str) -> str:
    return f"{CASES}:{name}"


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the spec's folder on sys.path


def audit_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["audit", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def failed(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for check in report["checks"]:
        if not check["passed"]:
            out.setdefault(check["name"], []).append(check)
    return out


# -- a good loader ---------------------------------------------------------------------------------
def test_good_loader_passes_every_check_at_the_default_settings(capsys, no_leaks):
    code = main(["audit", spec("good"), "--check", spec("pairs_ok"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert "workers=0, workers=2 thread, workers=2 process" in lines[0]
    assert sum(line.startswith("PASS  exactly_once") for line in lines) == 6  # 3 settings x 2 epochs
    for name in ("readable", "reproducible", "pairing", "check"):
        assert any(line.startswith(f"PASS  {name} ") for line in lines), name
    assert not any(line.startswith("FAIL") for line in lines)
    assert lines[-1] == "PASSED: 0 of 11 checks failed"


def test_json_report_is_stable_and_complete(capsys, no_leaks):
    code, report = audit_json(capsys, spec("good"), *THREADS, "--epochs", "1")
    assert code == 0
    assert set(report) == {
        "format",
        "passed",
        "target",
        "samples",
        "epochs",
        "settings",
        "loader",
        "checks",
        "findings",
    }
    assert (report["format"], report["passed"], report["samples"]) == ("steadyfeed.audit/1", True, 96)
    once = [c for c in report["checks"] if c["name"] == "exactly_once"]
    assert [(c["setting"], c["epoch"]) for c in once] == [("workers=0", 0), ("workers=2 thread", 0)]
    assert once[0]["details"]["delivered"] == 96 and once[0]["details"]["missing"] == {"count": 0, "ids": []}
    for check in report["checks"]:
        assert set(check) == {"name", "status", "summary", "setting", "epoch", "details", "passed"}


# -- each fault, diagnosed ---------------------------------------------------------------------------
def test_a_sampler_that_drops_a_sample_fails_exactly_once_naming_it(capsys, no_leaks):
    code, report = audit_json(capsys, spec("drops_one"), *THREADS)
    assert code == 1
    bad = failed(report)
    assert set(bad) == {"exactly_once"} and len(bad["exactly_once"]) == 4  # every setting, every epoch
    assert all(c["details"]["missing"]["ids"] == [17] for c in bad["exactly_once"])


def test_a_sampler_that_repeats_a_sample_fails_exactly_once_naming_it(capsys, no_leaks):
    code, report = audit_json(capsys, spec("duplicates_one"), *THREADS)
    assert code == 1
    bad = failed(report)
    assert set(bad) == {"exactly_once"}
    assert all(c["details"]["duplicated"]["ids"] == [5] for c in bad["exactly_once"])


def test_swapped_labels_are_caught_by_the_check_function(capsys, no_leaks):
    code, report = audit_json(capsys, spec("swaps_labels"), *THREADS, "--check", spec("pairs_ok"))
    assert code == 1
    bad = failed(report)
    assert set(bad) == {"check"}  # source[id] itself is wrong, so delivery by id is faithful
    assert bad["check"][0]["details"]["failed"] == {"count": 2, "ids": [10, 20]}


def test_a_batched_read_that_mixes_pairs_fails_pairing_by_id(capsys, no_leaks):
    code, report = audit_json(capsys, spec("mixes_pairs"), *THREADS)
    assert code == 1
    assert set(failed(report)) == {"pairing"}


def test_batches_that_depend_on_worker_count_fail_reproducible(capsys, no_leaks):
    code = main(["audit", spec("nondeterministic"), *THREADS])
    out = capsys.readouterr().out
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL  ")]
    assert len(fails) == 1 and "reproducible" in fails[0] and "workers=2 thread differs from workers=0" in fails[0]


def test_validation_samples_in_training_are_reported_from_both_sides(capsys, no_leaks):
    code, report = audit_json(capsys, spec("train"), *THREADS, "--against", spec("leaky_validation"))
    assert code == 1
    leak = failed(report)["contamination"][0]["details"]
    assert leak == {"ids": {"count": 3, "ids": [3, 7, 50]}, "against_ids": {"count": 3, "ids": [16, 17, 18]}}
    code, report = audit_json(capsys, spec("train"), *THREADS, "--against", spec("validation"))
    assert code == 0 and any(c["name"] == "contamination" for c in report["checks"])


# -- usage errors: one line, exit code 2 ----------------------------------------------------------------
@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "give exactly one of SPEC, --npy-pairs"),
        (["nothing_here"], "SPEC must be FILE.py:NAME or MODULE:NAME"),
        (["missing_file.py:make"], "SPEC file not found"),
        (["{cases}:nothing"], "has no 'nothing'"),
        (["{cases}:not_a_source"], "gave a int, expected a steadyfeed.Loader or a source"),
        (["{cases}:good", "--settings", "2:fork"], "a setting is WORKERS or WORKERS:MODE"),
        (["{cases}:good", "--check", "{cases}:threshold"], "is a float, expected a function"),
        (["{cases}:good", "--checks", "sharp"], "unknown check(s) 'sharp'"),
        (["{cases}:good", "--batch-size", "0"], "invalid loader options"),
        (["{cases}:good", "--npy", "x.npy"], "give exactly one of SPEC"),
        (["--hdf5", "d.h5"], "--hdf5 needs the datasets to read"),
    ],
)
def test_usage_errors_print_one_line_and_exit_2(capsys, argv, message):
    assert main(["audit", *(a.format(cases=CASES) for a in argv), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("steadyfeed audit: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_the_installed_console_script_runs_it(tmp_path):
    script = Path(sys.executable).parent / "steadyfeed"
    done = subprocess.run(
        [str(script), "audit", spec("drops_one"), "--settings", "0", "--epochs", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["passed"] is False
    assert "audit" in done.stderr  # the progress bar


def test_a_module_spec_works_like_a_file_spec(capsys, monkeypatch, no_leaks):
    monkeypatch.syspath_prepend(str(CASES.parent))
    code, report = audit_json(capsys, "audit_cases:train", *THREADS, "--batch-size", "20", "--no-shuffle")
    assert (
        code == 0
        and report["loader"].startswith("Loader(ArraySource(x=float64[80, 4]")
        and "batch_size=20" in report["loader"]
        and "SequentialSampler" in report["loader"]
    )  # flags override the returned Loader


# -- shortcuts ------------------------------------------------------------------------------------------
def _npy(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(40, dtype=np.float32).reshape(20, 2))
    np.save(tmp_path / "y.npy", np.arange(20) % 3)
    return ["--npy", str(tmp_path / "x.npy"), "--key", f"y={tmp_path / 'y.npy'}"]


def _csv(tmp_path):
    (tmp_path / "d.csv").write_text("a,b,label\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(20)))
    return ["--csv", str(tmp_path / "d.csv"), "--x", "a,b", "--y", "label", "--dtype", "y=int64"]


def _hdf5(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["images"] = np.arange(20 * 6, dtype=np.uint8).reshape(20, 2, 3)
        f["labels"] = np.arange(20) % 4
    return ["--hdf5", str(tmp_path / "d.h5"), "--key", "x=/images", "--key", "y=/labels"]


def _images(tmp_path):
    image = pytest.importorskip("PIL.Image")
    for i in range(20):
        (tmp_path / f"class{i % 2}").mkdir(exist_ok=True)
        image.fromarray(np.full((6, 5, 3), i * 10, np.uint8)).save(tmp_path / f"class{i % 2}" / f"{i}.png")
    return ["--images", str(tmp_path), "--image-size", "4", "4"]


def _tfrecord(tmp_path):
    pytest.importorskip("google.protobuf")
    from steadyfeed import pack

    pack(ArraySource(x=np.arange(40.0).reshape(20, 2), y=np.arange(20) % 3), tmp_path / "packed", 8, progress=False)
    return ["--tfrecord", str(tmp_path / "packed")]


@pytest.mark.parametrize("make", [_npy, _csv, _hdf5, _images, _tfrecord])
def test_shortcuts_build_the_standard_sources(make, tmp_path, capsys, no_leaks):
    argv = make(tmp_path)
    code, report = audit_json(capsys, *argv, *THREADS, "--batch-size", "8", "--shuffle")
    assert code == 0, failed(report)
    assert report["samples"] == 20 and report["target"] == " ".join(argv[:2])
    assert next(c for c in report["checks"] if c["name"] == "pairing")["status"] == "pass"


# -- the library: documented drop / shard / pad / weighted / skip behaviour ---------------------------------
def statuses(report) -> dict:
    return {(c.name, c.setting, c.epoch): c.status for c in report.checks}


@pytest.mark.parametrize(
    "options",
    [
        dict(last_batch="drop", shard_count=3),
        dict(last_batch="pad", shard_count=3),
        dict(last_batch="partial", shard_count=2),
    ],
)
def test_shards_and_last_batch_rules_pass_when_the_loader_keeps_them(options, no_leaks):
    with Loader(paired_source(50), 8, shuffle=True, **options) as loader:
        report = audit(loader, settings=[(0, "thread"), (2, "thread")])
    assert report.passed, report.table()
    once = [c for c in report.checks if c.name == "exactly_once"]
    cfg = loader.config
    assert all(
        c.details["delivered"] == expected_count(50, 8, cfg.sharding.shard_count, cfg.read.last_batch) for c in once
    )


def test_weighted_sampler_is_checked_for_range_only():
    labels = np.r_[np.zeros(40), np.ones(10)]
    with Loader(paired_source(50), 8, sampler=WeightedSampler.balanced(labels)) as loader:
        report = audit(loader, settings=[(0, "thread")])
    assert report.passed, report.table()
    names = {c.name for c in report.checks}
    assert "ids_in_range" in names and "exactly_once" not in names


def test_samples_skipped_under_on_error_skip_fail_the_audit(no_leaks):
    with Loader(FaultySource(40, fail={6}), 8, on_error="skip", max_error_fraction=0.5) as loader:
        report = audit(loader, epochs=1, settings=[(0, "thread"), (2, "thread")])
    bad = {c.name: c for c in report.failed}
    assert set(bad) == {"readable", "exactly_once"}
    assert bad["readable"].details["failed"][0]["location"] == "/data/sample_00006.npy"
    assert all(
        c.details["skipped"]["ids"] == [6] and c.details["missing"]["count"] == 0
        for c in report.failed
        if c.name == "exactly_once"
    )


def test_an_epoch_stopped_by_an_error_is_reported_not_raised():
    with Loader(FaultySource(40, fail={6}), 8) as loader:
        report = audit(loader, epochs=1, settings=[(0, "thread")])
    once = next(c for c in report.checks if c.name == "exactly_once")
    assert once.status == "fail" and "epoch stopped by SampleError[ValueError]: sample 6" in once.summary


def test_parse_settings():
    assert parse_settings("0, 2,4:process") == [(0, "thread"), (2, "thread"), (4, "process")]
    with pytest.raises(ValueError):
        parse_settings("")
    assert expected_count(50, 8, 3, "drop") == 3 * ((50 // 3) // 8) * 8


def test_a_source_without_labels_skips_pairing():
    with Loader(ArraySource(x=np.arange(12.0)), 4) as loader:
        report = audit(loader, epochs=1, settings=[(0, "thread")])
    assert report.passed and statuses(report)[("pairing", None, None)] == "skip"


def test_report_and_findings_show_the_unreadable_sample(capsys, tmp_path, no_leaks):
    page, saved = tmp_path / "audit.html", tmp_path / "findings.json"
    code = main(
        ["audit", spec("unreadable"), *THREADS, "--epochs", "1", "--report", str(page), "--findings", str(saved)]
    )
    assert code == 1, capsys.readouterr().out
    found = json.loads(saved.read_text())
    assert [(q["id"], q["file"]) for q in found["quarantine"]] == [(6, "/data/<six>/6.npy")]
    assert "truncated file" in found["quarantine"][0]["error"]
    text = page.read_text()
    assert 'id="quarantine"' in text and "/data/&lt;six&gt;/6.npy" in text and "<six>" not in text
