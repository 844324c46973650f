"""``steadyfeed inspect``: counts, sizes, formats, shapes, image modes, labels and unreadable
files of a directory or file, and the samples of any loader or source."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from steadyfeed.tools.cli import main
from steadyfeed.tools.inspection import inspect_files, size_summary

pytestmark = pytest.mark.timeout(60)

Image = pytest.importorskip("PIL.Image")
CASES = Path(__file__).parent / "cli_specs" / "audit_cases.py"


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts a spec's folder on sys.path


@pytest.fixture
def folder(tmp_path):
    """cats/ and dogs/: 9 RGB images (PNG and JPEG), a grayscale one, a blank one, a corrupt one."""
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for name in ("cats", "dogs"):
        (root / name).mkdir(parents=True)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(root / "cats" / f"c{i}.png")
        Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(root / "dogs" / f"d{i}.jpg")
    Image.fromarray(np.zeros((12, 10, 3), np.uint8)).save(root / "cats" / "blank.png")
    Image.fromarray(rng.integers(0, 255, (12, 10), dtype=np.uint8)).save(root / "dogs" / "gray.png")
    (root / "dogs" / "corrupt.jpg").write_bytes(b"\xff\xd8 this is not a JPEG")
    (root / ".hidden").write_text("never listed")
    return root


def inspect_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["inspect", *argv, "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def test_an_image_folder_is_counted_and_the_corrupt_file_listed(folder, capsys):
    code, report = inspect_json(capsys, str(folder))
    assert code == 1  # an unreadable file
    assert (report["kind"], report["count"]) == ("image tree", 11)
    assert report["unreadable"] == [
        {"item": os.path.join("dogs", "corrupt.jpg"), "error": report["unreadable"][0]["error"]}
    ]
    assert "UnidentifiedImageError" in report["unreadable"][0]["error"]
    assert report["modes"] == {"RGB": 9, "L": 1}
    assert report["formats"] == {"PNG": 6, "JPEG": 4}
    assert report["shapes"]["image"] == {"12x10x3": 9, "12x10x1": 1}
    assert report["outliers"]["image mode"]["items"] == [os.path.join("dogs", "gray.png")]
    assert report["labels"] == {"source": "images per class folder", "counts": {"cats": 5, "dogs": 6}}
    sizes = report["sizes"]
    assert sizes["min"] <= sizes["median"] <= sizes["max"]
    assert sum(b["count"] for b in sizes["histogram"]) == 11


def test_the_text_report_names_the_grayscale_image_and_the_corrupt_file(folder, capsys):
    assert main(["inspect", str(folder), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "modes         RGB 9, L 1" in out
    assert f"differ in image mode from the most common (RGB, 9): {os.path.join('dogs', 'gray.png')}" in out
    (line,) = [line for line in out.splitlines() if line.strip().startswith(os.path.join("dogs", "corrupt.jpg"))]
    assert "UnidentifiedImageError" in line and "BytesIO" not in line
    assert out.rstrip().endswith("FAILED: 1 unreadable, 0 refused by a loader, 0 quality problem(s)")
    assert "  unreadable    1:" in out


def test_decode_finds_truncated_files_and_checks_find_blank_images(folder, capsys):
    (folder / "dogs" / "corrupt.jpg").unlink()
    data = (folder / "cats" / "c0.png").read_bytes()
    (folder / "cats" / "cut.png").write_bytes(data[: len(data) // 2])
    assert inspect_json(capsys, str(folder))[0] == 0  # the header alone looks fine
    code, report = inspect_json(capsys, str(folder), "--decode")
    assert code == 1 and [u["item"] for u in report["unreadable"]] == [os.path.join("cats", "cut.png")]
    code, report = inspect_json(capsys, str(folder), "--checks", "not_constant", "--workers", "2")
    assert code == 1 and report["problem_count"] == 1
    assert report["problems"][0] | {"detail": ""} == {
        "sample_id": os.path.join("cats", "blank.png"),
        "key": "image",
        "check": "not_constant",
        "detail": "",
    }


def test_threads_give_the_same_report(folder):
    assert inspect_files(folder, workers=3).as_dict() == inspect_files(folder).as_dict()


def test_npy_and_hdf5_files_show_shapes_and_dtypes(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((5, 3), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((5, 3), np.float32))
    np.save(tmp_path / "odd.npy", np.zeros(2, np.int16))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-4])
    (tmp_path / "notes.txt").write_text("hello")
    code, report = inspect_json(capsys, str(tmp_path))
    assert code == 1 and [u["item"] for u in report["unreadable"]] == ["cut.npy"]
    assert "truncated" in report["unreadable"][0]["error"]
    assert report["shapes"]["npy"] == {"5x3 float32": 2, "2 int16": 1}
    assert report["formats"] == {"npy": 3} and report["labels"] is None and report["count"] == 4
    assert report["ignored"] == [{"item": "notes.txt", "reason": "no steadyfeed source reads .txt files"}]
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["images"] = np.zeros((4, 8, 8), np.uint8)
        f["meta/labels"] = np.arange(4)
    code, report = inspect_json(capsys, str(tmp_path / "d.h5"))
    assert code == 0 and report["count"] == 1 and report["formats"] == {"hdf5": 1}
    assert report["shapes"] == {"/images": {"4x8x8 uint8": 1}, "/meta/labels": {"4 int64": 1}}


def test_a_loader_spec_is_read_as_stored(capsys, no_leaks):
    code, report = inspect_json(capsys, f"{CASES}:good", "--workers", "2")
    assert code == 0
    assert (report["kind"], report["count"], report["unreadable"]) == ("samples", 96, [])
    assert report["shapes"] == {"x": {"4 float64": 96}, "y": {"scalar float64": 96}}
    assert report["sizes"]["min"] == report["sizes"]["max"] == 40


def test_a_source_shortcut_lists_unreadable_samples_labels_and_quality(tmp_path, capsys, no_leaks):
    for d in ("in", "lab"):
        (tmp_path / d).mkdir()
    for i in range(6):
        x = np.random.default_rng(i).random((2, 2))
        x[0, 0] = np.nan if i == 2 else x[0, 0]
        np.save(tmp_path / "in" / f"{i}.npy", x)
        np.save(tmp_path / "lab" / f"{i}.npy", np.int64(i % 3))
    (tmp_path / "in" / "4.npy").write_bytes(b"garbage")
    code, report = inspect_json(
        capsys, "--npy-pairs", str(tmp_path / "in"), str(tmp_path / "lab"), "--checks", "finite", "--workers", "2"
    )
    assert code == 1
    assert report["target"] == f"--npy-pairs {tmp_path / 'in'} {tmp_path / 'lab'}"
    (bad,) = report["unreadable"]
    assert bad["sample_id"] == 4 and str(tmp_path / "in" / "4.npy") in bad["item"] and "DataError" in bad["error"]
    assert report["labels"] == {"source": "key 'y'", "counts": {"0": 2, "1": 1, "2": 2}}
    assert [(p["sample_id"], p["check"]) for p in report["problems"]] == [(2, "finite")]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["no/such/dir"], "no/such/dir: no such file or directory"),
        (["{cases}:missing"], "has no 'missing'"),
        ([".", "--checks", "shiny"], "unknown check(s) 'shiny'"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    assert main(["inspect", *(a.format(cases=CASES) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("steadyfeed inspect: error: ") and message in err


def test_the_installed_console_script_runs_it(folder):
    script = Path(sys.executable).parent / "steadyfeed"
    done = subprocess.run([str(script), "inspect", str(folder), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["modes"] == {"RGB": 9, "L": 1}
    assert "inspect images" in done.stderr  # the progress bar


def test_size_summary_buckets_are_powers_of_two():
    summary = size_summary([0, 1, 3, 1000, 1024])
    assert (summary["min"], summary["median"], summary["max"]) == (0, 3, 1024)
    edges = [(b["from"], b["to"]) for b in summary["histogram"]]
    assert edges[:3] == [(0, 1), (1, 2), (2, 4)] and edges[-1] == (1024, 2048)
    assert [b["count"] for b in summary["histogram"]] == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert size_summary([])["histogram"] == []


# -- messy data: inspect refuses what a loader refuses, and says why --------------------------------
import messy  # noqa: E402 - the builders of the messy trees, shared with test_collate.py


def test_a_messy_image_tree_lists_the_empty_class_the_odd_size_and_ignores_notes(tmp_path, capsys):
    root = messy.image_tree(tmp_path / "tree", empty_class=True, notes=True)
    code, report = inspect_json(capsys, str(root))
    assert code == 1 and report["kind"] == "image tree" and report["count"] == 12  # notes.txt is no image
    assert report["ignored"] == [{"item": os.path.join("cats", "notes.txt"), "reason": report["ignored"][0]["reason"]}]
    assert "not an image file" in report["ignored"][0]["reason"]
    refused = {r["item"]: r["reason"] for r in report["refused"]}
    assert set(refused) == {"birds" + os.sep, messy.ODD_IMAGE.replace("/", os.sep)}
    assert "holds no image files" in refused["birds" + os.sep]
    assert "50x70 image where 11 are 24x32" in refused[messy.ODD_IMAGE.replace("/", os.sep)]
    assert "collate='pad'" in refused[messy.ODD_IMAGE.replace("/", os.sep)]
    assert report["image_sizes"] == {"24x32": 11, "50x70": 1} and report["modes"] == {"RGB": 12}
    assert report["labels"]["counts"] == {"cats": 6, "dogs": 6, "birds": 0}
    (root / "birds").rmdir()
    assert inspect_json(capsys, str(root), "--image-size", "24", "32")[0] == 0  # ImageFolder(size=...) reads it
    assert inspect_json(capsys, str(root), "--collate", "pad")[0] == 0
    out = (main(["inspect", str(root), "--no-progress"]), capsys.readouterr().out)
    assert out[0] == 1 and "image sizes   24x32 11, 50x70 1" in out[1] and "ignored       1:" in out[1]


def test_an_image_tree_through_the_images_shortcut_is_judged_as_the_loader_would(tmp_path, capsys, no_leaks):
    root = messy.image_tree(tmp_path / "tree", empty_class=True)
    code, report = inspect_json(capsys, "--images", str(root))
    assert code == 1 and "holds no image files" in report["refused"][0]["reason"]  # ImageFolder refuses the tree
    (root / "birds").rmdir()
    code, report = inspect_json(capsys, "--images", str(root), "--workers", "2")
    odd = 3  # cats/c3.png, fourth in sorted order
    assert code == 1 and [r["sample_id"] for r in report["refused"]] == [odd]
    assert report["refused"][0]["item"] == str(root / messy.ODD_IMAGE)
    assert inspect_json(capsys, "--images", str(root), "--image-size", "24", "32")[0] == 0
    assert inspect_json(capsys, "--images", str(root), "--collate", "pad")[0] == 0


def test_an_empty_image_file_is_unreadable_and_named_plainly(tmp_path, capsys):
    root = messy.image_tree(tmp_path / "tree", odd=False, empty_file=True)
    code, report = inspect_json(capsys, str(root))
    (bad,) = report["unreadable"]
    assert code == 1 and bad["item"] == os.path.join("dogs", "empty.png")
    assert "empty file (0 bytes)" in bad["error"] and "BytesIO" not in bad["error"]


def test_hdf5_variable_length_strings_are_refused_under_stack_and_shown_in_a_table(tmp_path, capsys, no_leaks):
    pytest.importorskip("h5py")
    path = messy.vlen_hdf5(tmp_path / "names.h5")
    code, report = inspect_json(capsys, str(path))
    assert code == 1
    rows = {r["dataset"]: r for r in report["tables"]["names.h5"]["datasets"]}
    assert rows["/names"]["dtype"] == "vlen str (ascii)" and rows["/names"]["note"] == "6..8 bytes"
    assert (rows["/y"]["shape"], rows["/y"]["dtype"]) == ("50", "int64")
    (refused,) = report["refused"]
    assert refused["item"] == "names.h5 /names" and "strings of different lengths" in refused["reason"]
    assert inspect_json(capsys, str(path), "--collate", "pad")[0] == 0
    text = (main(["inspect", str(path), "--no-progress"]), capsys.readouterr().out)[1]
    assert "/names" in text and "vlen str (ascii)" in text and "dataset" in text
    code, report = inspect_json(capsys, "--hdf5", str(path), "--key", "x=/names", "--key", "y=/y")
    assert (
        code == 1
        and report["refused"]
        and all("strings of different lengths" in r["reason"] for r in report["refused"])
    )
    assert inspect_json(capsys, "--hdf5", str(path), "--key", "x=/names", "--collate", "pad")[0] == 0


def test_a_big_endian_npy_among_native_ones_passes(tmp_path, capsys, no_leaks):
    inputs, labels = messy.npy_pairs(tmp_path)
    code, report = inspect_json(capsys, "--npy-pairs", str(inputs), str(labels))
    assert code == 0 and report["shapes"]["x"] == {"3x4 float32": 12}  # read in native order, like the others


def test_a_csv_shows_rows_columns_types_and_missing_values_and_refuses_what_csvsource_refuses(tmp_path, capsys):
    path = messy.csv_file(tmp_path / "t.csv")
    code, report = inspect_json(capsys, str(path))
    assert code == 1
    summary = report["tables"]["t.csv"]
    assert summary["rows"] == 7
    assert [(c["name"], c["type"], c["missing"]) for c in summary["columns"]] == [
        ("a", "float", 1),
        ("b", "int", 1),
        ("name", "text", 0),
    ]
    # empty fields are missing values, NaN as a CsvSource reads them (as pandas): only the short row is refused
    assert [(r["item"], r["reason"].split(":")[0]) for r in report["refused"]] == [
        ("t.csv:7", "expected 3 fields (as in the header), found 2")
    ]
    assert [c["note"] for c in summary["columns"]] == [
        "",
        "missing values: NaN as float32, or fill= for an integer key",
        "text: read it as class ids with --dtype KEY=class",
    ]
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]  # nothing written beside the data (no index cache)


def tf_example(i: int) -> bytes:
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2] * 6)),
        "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 4 + 1)))),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"n%d" % i])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.mark.timeout(300)  # the session's first TensorFlow import can take minutes on a loaded machine
def test_a_tensorflow_written_tfrecord_lists_its_features_and_the_flags_that_read_it(tmp_path, capsys, no_leaks):
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    path = str(tmp_path / "train.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(8):
            writer.write(tf_example(i))
    code, report = inspect_json(capsys, path)
    assert code == 0
    summary = report["tables"]["train.tfrecord"]
    assert summary["records"] == 8
    assert {f["feature"]: (f["kind"], f["values"]) for f in summary["features"]} == {
        "name": ("bytes_list", "1"),
        "tokens": ("int64_list", "1..4"),
        "x": ("float_list", "6"),
    }
    assert summary["read_with"] == "--feature name=bytes --feature tokens=int64:? --feature x=float32:6"
    flags = summary["read_with"].split()
    code, report = inspect_json(capsys, "--tfrecord", path, *flags)  # as a loader: the varying list is refused
    assert code == 1 and {r["sample_id"] for r in report["refused"]} and "tokens" in report["refused"][0]["reason"]
    assert inspect_json(capsys, "--tfrecord", path, *flags, "--collate", "pad")[0] == 0
    code, report = inspect_json(capsys, "--tfrecord", path)  # no --feature: the files themselves
    assert code == 0 and report["tables"]["train.tfrecord"]["records"] == 8
    assert {f["feature"]: f["inferred"] for f in summary["features"]} == {  # what TFRecordSource infers
        "name": "bytes",
        "tokens": "int64 (None,)",
        "x": "float32 (6,)",
    }
    with tf.io.TFRecordWriter(str(tmp_path / "z.tfrecord"), options="GZIP") as writer:
        writer.write(tf_example(0))
    code, report = inspect_json(capsys, str(tmp_path / "z.tfrecord"))
    assert code == 0 and report["tables"]["z.tfrecord"]["compression"] == "GZIP"
    assert not [f for f in os.listdir(tmp_path) if f.startswith("z.tfrecord.")]  # no copy nor index beside the data


def test_a_cut_gzip_tfrecord_is_read_up_to_the_cut_and_index_caches_are_not_data(tmp_path, capsys, no_leaks):
    from steadyfeed.packing import pack
    from steadyfeed.sources.tfrecord import TFRecordSource, encode_example, infer_specs

    sample = {"x": np.arange(3, dtype=np.float32)}
    path = messy.gzip_tfrecord(tmp_path / "g.tfrecord", [encode_example(sample, infer_specs(sample))] * 4)
    path.write_bytes(path.read_bytes()[:-12])  # the gzip trailer and some data: a truncated stream
    source = TFRecordSource(str(path), features={"x": ("float32", (3,))}, cache_dir=tmp_path / "cache")
    good = len(source) - 1  # the records that decompressed whole, then the cut
    assert good >= 1 and source.compressions == ["GZIP"] and source[good - 1]["x"].tolist() == [0, 1, 2]
    with pytest.raises(Exception, match="GZIP stream .* ends before its end marker"):
        source[good]
    source.close()
    code, report = inspect_json(capsys, str(path))  # inspect says the same
    assert code == 1 and [u["item"] for u in report["unreadable"]] == [f"g.tfrecord record {good}"]
    assert "ends before its end marker (the file is truncated)" in report["unreadable"][0]["error"]
    out = pack([sample] * 5, tmp_path / "packed", progress=False)
    TFRecordSource(out).close()
    code, report = inspect_json(capsys, str(out))
    assert code == 0 and report["formats"] == {"tfrecord": 1}
    assert [i["item"] for i in report["ignored"]] == ["manifest.json", "shard-00000-of-00001.tfrecord.sfidx.npy"]
    assert "pack output" in report["ignored"][0]["reason"] and "index cache" in report["ignored"][1]["reason"]
