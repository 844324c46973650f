"""pack(): bit-exact round trips, order, atomic output, clear errors, progress, the CLI; and serialized()."""

import json
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import FaultySource, assert_paired, label_of

from steadyfeed import ArraySource, DataError, Loader, TooManyErrors
from steadyfeed.locking import Serialized, serialized
from steadyfeed.packing import pack
from steadyfeed.sources.tfrecord import TFRecordSource
from steadyfeed.tools.cli import main

pytestmark = pytest.mark.timeout(60)

N = 40


def every_kind(n: int) -> ArraySource:
    """One key per supported kind: arrays of several dtypes (0-d too), fixed-width str and bytes."""
    rng = np.random.default_rng(0)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 5e-324, 1.0])
    return ArraySource(
        f32=rng.standard_normal((n, 3, 2)).astype(np.float32),
        u8=rng.integers(0, 256, (n, 5), dtype=np.uint8),
        i64=rng.integers(-(2**62), 2**62, n),  # 0-d int64 per sample
        f64=np.resize(special, (n, 6)),
        flag=rng.random((n, 2, 2)) > 0.5,
        scalar=rng.standard_normal(n).astype(np.float32),
        i16=rng.integers(-300, 300, (n, 0), dtype=np.int16),  # an empty dimension
        name=np.array([f"sample é{i}" for i in range(n)]),  # np.str_ values: "str" features
        tag=np.array([b"t\x00\xff%d" % i for i in range(n)]),  # np.bytes_ values: "bytes" features
    )


def assert_bit_exact(back: dict, original: dict) -> None:
    assert list(back) == list(original)
    for key, value in original.items():
        a, b = np.asarray(back[key]), np.asarray(value)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), key
        assert a.tobytes() == b.tobytes(), key  # bitwise: NaN and -0.0 included


def shard_bytes(out) -> list[bytes]:
    return [open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out)) if f.endswith(".tfrecord")]


def leftovers(parent) -> list[str]:
    return sorted(os.listdir(parent))


# -- round trips ------------------------------------------------------------------------------------
def test_round_trip_of_a_source_is_bit_exact_with_a_manifest(tmp_path):
    source = every_kind(N)
    out = pack(source, tmp_path / "out", shard_size=16, progress=False)
    assert sorted(os.listdir(out)) == ["manifest.json"] + [
        f"shard-0000{k}-of-00003.tfrecord{suffix}" for k in range(3) for suffix in ("", ".sfidx.npy")
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == N and manifest["version"] == 1
    assert manifest["features"]["f32"] == {"dtype": "float32", "shape": [3, 2]}
    assert manifest["features"]["i64"] == {"dtype": "int64", "shape": []}
    assert manifest["features"]["name"] == {"dtype": "str", "shape": []}
    assert [s["records"] for s in manifest["shards"]] == [16, 16, 8]
    packed = TFRecordSource(out)
    assert len(packed) == N
    for i in range(N):
        assert_bit_exact(packed[i], source[i])
    packed.close()
    subset = TFRecordSource(out, features={"i64": "int64"})  # the manifest's specs can be narrowed
    assert_bit_exact(subset[N - 1], {"i64": source[N - 1]["i64"]})
    subset.close()


def test_round_trip_of_a_generator_keeps_variable_bytes_and_str(tmp_path):
    def legacy():
        for i in range(N):
            yield {
                "raw": b"\x00ab\x00" * i,
                "text": "ü" * i,
                "x": np.full((2, i % 3 + 1), i, np.int8)[:, :1],
                "y": i % 2 == 0,
            }

    out = pack(legacy(), tmp_path / "out", shard_size=7, progress=False)
    assert len([f for f in os.listdir(out) if f.endswith(".tfrecord")]) == 6
    packed = TFRecordSource(out)
    for i, original in enumerate(legacy()):
        back = packed[i]
        assert back["raw"] == original["raw"] and type(back["raw"]) is bytes
        assert back["text"] == original["text"] and type(back["text"]) is str
        assert_bit_exact({k: back[k] for k in ("x", "y")}, {k: original[k] for k in ("x", "y")})
    packed.close()


def test_big_endian_arrays_come_back_little_endian_with_the_same_values(tmp_path):
    values = np.arange(6, dtype=">i4").reshape(2, 3)
    packed = TFRecordSource(pack([{"x": values}], tmp_path / "out", progress=False))
    assert packed[0]["x"].dtype == np.dtype("<i4") and packed[0]["x"].tolist() == values.tolist()
    packed.close()


def test_output_bytes_do_not_depend_on_workers_or_mode(tmp_path, no_leaks):
    source = every_kind(N)
    reference = shard_bytes(pack(source, tmp_path / "inline", shard_size=16, progress=False))
    for workers, mode in [(2, "thread"), (2, "process")]:
        out = pack(source, tmp_path / mode, shard_size=16, workers=workers, mode=mode, progress=False)
        assert shard_bytes(out) == reference


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_packed_generator_is_random_access_parallel_and_exactly_once(tmp_path, mode, no_leaks):
    def legacy():  # no len, no indexing: a stream
        for i in range(203):
            x = np.arange(4 * i, 4 * i + 4, dtype=np.float64)
            yield {"x": x, "y": label_of(x[None])[0]}

    out = pack(legacy(), tmp_path / "out", shard_size=50, progress=False)
    with Loader(TFRecordSource(out), 16, shuffle=True, seed=1, workers=2, mode=mode, with_ids=True) as loader:
        for epoch in range(2):
            batches = list(loader.epoch(epoch))
            for batch in batches:
                assert_paired(batch)
            ids = np.concatenate([b["id"] for b in batches])
            assert sorted(ids.tolist()) == list(range(203)) and ids.tolist() != list(range(203))


def test_empty_inputs_make_an_empty_dataset(tmp_path):
    for name, data in (("source", ArraySource(x=np.zeros((0, 3)))), ("iterable", iter(()))):
        packed = TFRecordSource(pack(data, tmp_path / name, progress=False))
        assert len(packed) == 0


# -- bad input and atomicity -------------------------------------------------------------------------
class OddOneOut:
    """Sample 23 has a float64 ``x`` where the others have float32."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": np.zeros(3, np.float64 if i == 23 else np.float32), "y": np.int64(i)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_unlike_the_first_names_id_key_expected_and_found(tmp_path, workers, no_leaks):
    with pytest.raises(
        DataError,
        match=r"sample 23: key 'x': expected float32 \(3,\) \(as in the first sample\), "
        r"found float64 \(3,\)",
    ):
        pack(OddOneOut(), tmp_path / "out", shard_size=8, workers=workers, progress=False)
    assert leftovers(tmp_path) == []  # neither the output nor its staging directory


def test_a_generator_sample_with_other_keys_is_named(tmp_path):
    samples = [{"x": np.zeros(2)}] * 5 + [{"x": np.zeros(2), "extra": 1}]
    with pytest.raises(DataError, match=r"sample 5: keys \['extra', 'x'\] differ from the first sample's \['x'\]"):
        pack(iter(samples), tmp_path / "out", progress=False)
    assert leftovers(tmp_path) == []


def test_a_failing_read_names_the_sample_and_its_location(tmp_path, marker_dir):
    with pytest.raises(DataError, match=r"sample 13 \(/data/sample_00013.npy\): ValueError: corrupt sample 13"):
        pack(FaultySource(N, fail={13}, marker_dir=marker_dir), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_error_midway_leaves_nothing_behind(tmp_path):
    def broken():
        for i in range(30):
            if i == 25:
                raise RuntimeError("the legacy reader failed")
            yield {"x": np.zeros(2)}

    with pytest.raises(RuntimeError, match="legacy reader failed"):
        pack(broken(), tmp_path / "out", shard_size=10, progress=False)
    assert leftovers(tmp_path) == []


CRASHING_PACK = """
import os, signal, sys
import numpy as np
from steadyfeed.packing import pack

def samples():
    for i in range(100):
        if i == 60:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup code runs
        yield {"x": np.full(8, i)}

pack(samples(), sys.argv[1], shard_size=20, progress=False)
"""


def test_a_crash_leaves_no_dataset_that_looks_complete(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", CRASHING_PACK, str(out)], capture_output=True, timeout=50)
    assert proc.returncode == -9, proc.stderr.decode()
    assert not out.exists()
    (staging,) = leftovers(tmp_path)
    assert staging.startswith(".out.partial-") and "manifest.json" not in os.listdir(tmp_path / staging)
    with pytest.raises(FileNotFoundError, match="out"):
        TFRecordSource(out)


def test_pack_refuses_to_overwrite_but_fills_an_empty_directory(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="full exists and is not an empty directory"):
        pack([{"x": 1}], tmp_path / "full", progress=False)
    assert os.listdir(tmp_path / "full") == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert len(TFRecordSource(pack([{"x": 1}], tmp_path / "empty", progress=False))) == 1


def test_workers_need_a_source_and_bad_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="workers need a source"):
        pack(iter([{"x": 1}]), tmp_path / "out", workers=2, progress=False)
    with pytest.raises(ValueError, match="shard_size must be >= 1"):
        pack([{"x": 1}], tmp_path / "out", shard_size=0, progress=False)
    with pytest.raises(DataError, match="sample 0: dtype object cannot be packed"):
        pack([{"x": [1, None]}], tmp_path / "out", progress=False)
    assert leftovers(tmp_path) == []


def test_a_manifest_that_disagrees_with_the_shards_is_detected(tmp_path):
    out = pack(every_kind(N), tmp_path / "out", shard_size=16, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][1]["records"] = 15
    manifest["samples"] = N - 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="shard-00001-of-00003.tfrecord has 16 records but the manifest says 15"):
        TFRecordSource(out)
    os.unlink(out / "shard-00002-of-00003.tfrecord")
    with pytest.raises(FileNotFoundError, match="shard-00002-of-00003.tfrecord"):
        TFRecordSource(out)
    manifest["shards"][0]["file"] = "../elsewhere.tfrecord"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="manifest.json is not a valid steadyfeed manifest: a shard file name"):
        TFRecordSource(out)


# -- progress ---------------------------------------------------------------------------------------
def test_progress_goes_to_stderr_and_can_be_turned_off(tmp_path, capfd):
    pack(every_kind(N), tmp_path / "a", progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "pack a" in err and f"{N}/{N}" in err
    pack(iter([{"x": 1}] * 3), tmp_path / "b", progress=True)
    assert "3 samples" in capfd.readouterr().err  # no total for an iterable
    pack(every_kind(N), tmp_path / "c", progress=False)
    assert capfd.readouterr() == ("", "")


# -- the CLI ----------------------------------------------------------------------------------------
SPEC_FILE = """
import numpy as np

def samples():
    for i in range(25):
        yield {"x": np.full(3, i, np.float32), "y": np.int64(i)}

class Squares:
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return {"x": np.array([i * i])}
"""


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the file's directory
    monkeypatch.delitem(sys.modules, "make_data", raising=False)
    path = tmp_path / "make_data.py"
    path.write_text(SPEC_FILE)
    yield path
    sys.modules.pop("make_data", None)


def test_cli_packs_a_generator_from_a_file(spec_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["pack", f"{spec_file}:samples", str(out), "--shard-size", "10", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"packed 25 samples into 3 shard(s) in {out}")
    packed = TFRecordSource(out)
    assert len(packed) == 25 and packed[24]["x"].tolist() == [24.0] * 3 and packed[24]["y"] == 24
    packed.close()


def test_cli_packs_a_source_class_with_process_workers(spec_file, tmp_path, capsys, no_leaks):
    out = tmp_path / "out"
    assert (
        main(["pack", "make_data:Squares", str(out), "--workers", "2", "--mode", "process", "--no-progress"]) == 2
    )  # not importable by module name before the file was loaded: a usage error
    assert "cannot import module 'make_data'" in capsys.readouterr().err
    assert main(["pack", f"{spec_file}:Squares", str(out), "--workers", "2", "--mode", "process", "--no-progress"]) == 0
    packed = TFRecordSource(out)
    assert [int(s["x"][0]) for s in packed.read_many(range(12))] == [i * i for i in range(12)]
    packed.close()


@pytest.mark.parametrize(
    "spec,message",
    [
        ("no_colon", "SPEC must be FILE.py:NAME or MODULE:NAME"),
        ("missing.py:samples", "SPEC file not found"),
        ("{file}:nothing", "has no 'nothing'"),
    ],
)
def test_cli_reports_bad_specs_with_exit_code_2_like_every_command(spec_file, tmp_path, capsys, spec, message):
    assert main(["pack", spec.format(file=spec_file), str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("steadyfeed pack: error: ") and message in err
    assert not (tmp_path / "out").exists()


# -- serialized -------------------------------------------------------------------------------------
class Overlap:
    """Counts how many threads are inside at once; the maximum must stay 1 when serialized."""

    def __init__(self):
        self.inside = self.most = 0

    def __call__(self, x):
        self.inside += 1
        self.most = max(self.most, self.inside)
        time.sleep(0.002)  # releases the GIL: unserialized callers would pile up here
        self.inside -= 1
        return x


@serialized
def module_level_decode(x):
    return x * 2


def run_threads(fn, threads=8, calls=10):
    workers = [threading.Thread(target=lambda: [fn(k) for k in range(calls)]) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_serialized_lets_one_thread_in_at_a_time():
    bare = Overlap()
    run_threads(bare)
    assert bare.most > 1  # the detector works
    guarded = Overlap()
    run_threads(serialized(guarded))
    assert guarded.most == 1


def test_serialized_inside_a_threaded_loader_transform(no_leaks):
    overlap = Overlap()
    decode = serialized(overlap)

    def transform(sample, rng):
        return {**sample, "x": decode(sample["x"])}

    source = ArraySource(x=np.arange(64.0).reshape(32, 2))
    with Loader(source, 4, workers=2, mode="thread", transform=transform, with_ids=True) as loader:
        ids = np.concatenate([b["id"] for b in loader])
    assert sorted(ids.tolist()) == list(range(32)) and overlap.most == 1


def test_serialized_pickles_without_its_lock():
    assert pickle.loads(pickle.dumps(module_level_decode)) is module_level_decode  # by name, like a function
    assert module_level_decode(4) == 8 and module_level_decode.__name__ == "module_level_decode"
    wrapped = serialized(os.path.join, timeout=5)
    copy = pickle.loads(pickle.dumps(wrapped))
    assert isinstance(copy, Serialized) and copy is not wrapped and copy._lock is not wrapped._lock
    assert copy("a", "b") == os.path.join("a", "b") and copy.timeout == 5


def test_serialized_with_timeout_refuses_to_wait_forever():
    started, release = threading.Event(), threading.Event()

    def hung():
        started.set()
        release.wait(10)

    guarded = serialized(hung, timeout=0.1)
    holder = threading.Thread(target=guarded)
    holder.start()
    started.wait(5)
    try:
        with pytest.raises(TimeoutError, match="hung stayed busy in another thread for more than 0.1 s"):
            guarded()
    finally:
        release.set()
        holder.join()
    guarded()  # free again


# -- messy data, permissions, the shortcuts, exit codes -------------------------------------------
import messy  # noqa: E402 - the builders of messy data, shared with test_collate.py


@pytest.fixture(params=[0o022, 0o077], ids=["umask 022", "umask 077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_the_output_is_readable_as_the_umask_says(tmp_path, umask):
    out = pack(every_kind(N), tmp_path / "out", shard_size=16, progress=False)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask  # 0o755 under 022: the training job's account reads it
    for name in os.listdir(out):
        assert os.stat(out / name).st_mode & 0o777 == 0o666 & ~umask, name


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_skip_leaves_out_the_unreadable_image_lists_it_and_keeps_the_rest_bit_exact(tmp_path, workers, mode, no_leaks):
    pytest.importorskip("PIL")
    from steadyfeed.sources.images import ImageFolder

    source = ImageFolder(messy.image_tree(tmp_path / "tree", empty_file=True, notes=True), size=messy.SIZE)
    empty = source.files.index(str(tmp_path / "tree" / "dogs" / "empty.png"))
    with pytest.raises(DataError, match=rf"sample {empty} \(.*empty.png\): .*empty file"):
        pack(source, tmp_path / "raised", workers=workers, mode=mode, progress=False)
    assert not (tmp_path / "raised").exists()
    out = pack(
        source,
        tmp_path / "out",
        shard_size=5,
        workers=workers,
        mode=mode,
        progress=False,
        on_error="skip",
        max_error_fraction=0.1,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["quarantine"]
    assert (entry["sample_id"], entry["location"], entry["error_type"]) == (empty, source.files[empty], "DataError")
    assert manifest["samples"] == len(source) - 1
    packed = TFRecordSource(out)
    kept = [i for i in range(len(source)) if i != empty]
    for record, i in enumerate(kept):  # record k: the k-th sample that read
        assert_bit_exact(packed[record], source[i])
    packed.close()
    with pytest.raises(TooManyErrors, match="max_error_fraction=0.01"):
        pack(
            source,
            tmp_path / "strict",
            workers=workers,
            mode=mode,
            progress=False,
            on_error="skip",
            max_error_fraction=0.01,
        )
    assert not (tmp_path / "strict").exists()


def test_a_sample_unlike_the_first_is_not_skipped_under_skip(tmp_path):
    with pytest.raises(DataError, match="sample 23: key 'x': expected float32"):
        pack(OddOneOut(), tmp_path / "out", on_error="skip", max_error_fraction=1.0, progress=False)


def make_shortcut(kind: str, root) -> list[str]:
    """The command line of one SPEC shortcut, over data written for it; each source holds 6 samples."""
    if kind == "images":
        pytest.importorskip("PIL")
        return ["--images", str(messy.image_tree(root / "tree", per_class=3, odd=False))]
    if kind == "npy-pairs":
        return ["--npy-pairs", *map(str, messy.npy_pairs(root, n=6))]
    if kind == "npy":
        np.save(root / "x.npy", np.arange(12.0).reshape(6, 2))
        np.save(root / "y.npy", np.arange(6))
        return ["--npy", str(root / "x.npy"), "--key", f"y={root / 'y.npy'}"]
    if kind == "hdf5":
        h5py = pytest.importorskip("h5py")
        with h5py.File(root / "d.h5", "w") as f:
            f["x"] = np.arange(12.0).reshape(6, 2)
        return ["--hdf5", str(root / "d.h5"), "--key", "x=/x"]
    if kind == "csv":
        (root / "t.csv").write_text("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(6)))
        return ["--csv", str(root / "t.csv"), "--x", "a", "--y", "b"]
    if kind == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table({"a": np.arange(6.0), "b": np.arange(6)}), root / "t.parquet", row_group_size=4)
        return ["--parquet", str(root / "t.parquet"), "--x", "a", "--y", "b"]
    if kind == "webdataset":
        import tarfile

        with tarfile.open(root / "shard-000.tar", "w") as tar:  # Python's own tar writer
            for i in range(6):
                for ext in ("cls", "txt"):
                    (root / f"{i:03d}.{ext}").write_bytes(b"%d" % i)
                    tar.add(root / f"{i:03d}.{ext}", arcname=f"{i:03d}.{ext}")
        return ["--webdataset", str(root / "shard-000.tar")]
    if kind == "tfrecord-gzip":
        from steadyfeed.sources.tfrecord import encode_example, infer_specs

        records = [encode_example(s, infer_specs(s)) for s in ({"x": np.full(2, i, np.float32)} for i in range(6))]
        return ["--tfrecord", str(messy.gzip_tfrecord(root / "g.tfrecord.gz", records)), "--feature", "x=float32:2"]
    pack([{"x": np.full(2, i, np.float32)} for i in range(6)], root / "source", progress=False)
    return ["--tfrecord", str(root / "source")]


@pytest.mark.parametrize(
    "kind", ["images", "npy-pairs", "npy", "hdf5", "csv", "tfrecord", "tfrecord-gzip", "parquet", "webdataset"]
)
def test_every_spec_shortcut_packs(tmp_path, kind, capsys, no_leaks):
    argv = make_shortcut(kind, tmp_path)
    assert main(["pack", *argv, str(tmp_path / "out"), "--no-progress", "--workers", "2"]) == 0
    assert capsys.readouterr().out.startswith("packed 6 samples")
    packed = TFRecordSource(tmp_path / "out")
    assert len(packed) == 6
    packed.close()


def test_cli_skip_reports_what_it_left_out_and_usage_errors_exit_2(tmp_path, capsys, no_leaks):
    pytest.importorskip("PIL")
    root = messy.image_tree(tmp_path / "tree", empty_file=True)
    images = ["--images", str(root), "--image-size", "24", "32", "--no-progress"]
    assert main(["pack", *images, str(tmp_path / "a")]) == 1  # raise: the data failed
    assert "empty file" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main(["pack", *images, str(tmp_path / "b"), "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "packed 12 samples" in out and "skipped 1 sample(s)" in out and "empty.png" in out
    assert main(["pack", *images, str(tmp_path / "b"), "--on-error", "skip"]) == 2  # OUT is not empty
    assert "does not overwrite" in capsys.readouterr().err
    for argv in (["--shard-size", "0"], ["--max-error-fraction", "2"], ["--npy", str(tmp_path / "missing.npy")]):
        assert main(["pack", *(images if argv[0] != "--npy" else ["--no-progress"]), *argv, str(tmp_path / "c")]) == 2
        assert capsys.readouterr().err.startswith("steadyfeed pack: error: ")


def test_cli_encoded_packs_an_image_folder_as_its_files_bytes_which_tf_data_decodes(tmp_path, capsys, no_leaks):
    """``--encoded``: record i holds file i's bytes and label (JPEGs and a PNG, from Pillow), a
    pack the size of the files; steadyfeed's decode and TensorFlow's give the folder's pixels."""
    pytest.importorskip("PIL")
    from images_made import scene

    from steadyfeed import ImageFolder, decode_image

    root = tmp_path / "photos"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for j in range(3):
            scene(j + 3 * (c == "dog")).save(root / c / f"{j}.jpg", quality=85)
    scene(9).save(root / "dog" / "3.png")
    folder = ImageFolder(root)
    out = tmp_path / "packed"
    assert main(["pack", "--images", str(root), str(out), "--encoded", "--workers", "2", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"packed 7 samples into 1 shard(s) in {out}")
    records = TFRecordSource(out)
    files = [open(p, "rb").read() for p in folder.files]
    assert [records[i]["x"] for i in range(7)] == files
    assert [int(records[i]["y"]) for i in range(7)] == folder.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    for i in range(7):
        np.testing.assert_array_equal(decode_image(records[i]["x"]), folder[i]["x"])
    records.close()
    assert sum(os.path.getsize(out / f) for f in os.listdir(out)) < 2 * sum(map(len, files))  # not pixels
    tf = pytest.importorskip("tensorflow")
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in ("x", "y")}  # y: its int64's raw bytes
    shards = sorted(str(out / f) for f in os.listdir(out) if f.endswith(".tfrecord"))
    for i, record in enumerate(tf.data.TFRecordDataset(shards).take(3)):  # the JPEGs
        parsed = tf.io.parse_single_example(record, spec)
        pixels = tf.io.decode_jpeg(parsed["x"], channels=3, dct_method="INTEGER_ACCURATE").numpy()
        np.testing.assert_array_equal(pixels, folder[i]["x"])
        assert tf.io.decode_raw(parsed["y"], tf.int64).numpy().tolist() == [0]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--npy", "{npy}"], "has no encoded form"),
        (["--images", "{images}", "--image-size", "8", "8"], "--image-size and --channels apply when"),
        (["--images", "{images}", "--channels", "1"], "--image-size and --channels apply when"),
        (["--images", "{images}", "--decoded", "1.5"], "decoded must be a share of the images in [0, 1]"),
    ],
)
def test_cli_encoded_refuses_what_it_cannot_honour_with_exit_code_2(tmp_path, capsys, argv, message):
    pytest.importorskip("PIL")
    from images_made import scene

    (tmp_path / "images" / "a").mkdir(parents=True)
    scene(0).save(tmp_path / "images" / "a" / "0.jpg")
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    paths = {"npy": tmp_path / "x.npy", "images": tmp_path / "images"}
    argv = [a.format(**paths) for a in argv]
    assert main(["pack", *argv, str(tmp_path / "out"), "--encoded", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("steadyfeed pack: error: ") and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["demo", "pack", "bench", "audit", "inspect", "report"])
def test_every_commands_help_documents_its_exit_codes(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0" in text and "; 1 " in text and "2 a usage error" in text


def test_cli_decoded_holds_images_decoded_with_the_given_settings_beside_the_shards(tmp_path, capsys, no_leaks):
    pytest.importorskip("PIL")
    from images_made import scene

    from steadyfeed import DataError, ImageFolder

    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    for j in range(4):
        scene(j).save(root / "a" / f"{j}.jpg")
    out = tmp_path / "packed"
    images = ["pack", "--images", str(root), str(out), "--no-progress"]
    assert main([*images, "--decoded", "0.5"]) == 2
    assert "give --encoded too" in capsys.readouterr().err and not out.exists()
    assert main([*images, "--encoded", "--decoded", "1", "--image-size", "16", "12", "--channels", "1"]) == 0
    folder = ImageFolder(root, size=(16, 12), channels=1)
    packed = folder.from_encoded(TFRecordSource(out))
    assert packed.decoded.holds(np.arange(4)).all()
    np.testing.assert_array_equal(packed.read_batch([3, 1])["x"], np.stack([folder[3]["x"], folder[1]["x"]]))
    packed.close()
    with pytest.raises(DataError, match="its images were decoded with"):
        ImageFolder(root).from_encoded(TFRecordSource(out))
