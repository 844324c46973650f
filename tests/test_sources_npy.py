""".npy sources: NpyPairs (a file per sample, paired by name) and NpyArray (rows of big files).

Every file is written here with np.save; every read is checked against np.load.
"""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from helpers import assert_paired, label_of

from steadyfeed import CollateError, DataError, Loader, SampleError
from steadyfeed.sources.npy import NpyArray, NpyPairs, read_npy

pytestmark = pytest.mark.timeout(60)

WIDTH = 4
MODES = ["thread", "process"]


def x_of(i: int) -> np.ndarray:
    return np.arange(i * WIDTH, (i + 1) * WIDTH, dtype=np.float64)  # what assert_paired expects of row i


def write_pairs(root, n, name=lambda i: f"{i:04d}.npy"):
    """inputs/NAME holds x_of(i), labels/NAME holds label_of(x) (0-d): y = f(x) for every pair."""
    inputs, labels = root / "inputs", root / "labels"
    inputs.mkdir(exist_ok=True)
    labels.mkdir(exist_ok=True)
    for i in range(n):
        np.save(inputs / name(i), x_of(i))
        np.save(labels / name(i), label_of(x_of(i)[None])[0])
    return inputs, labels


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert (got.dtype, got.shape, got.flags.c_contiguous, got.flags.f_contiguous) == (
        want.dtype,
        want.shape,
        want.flags.c_contiguous,
        want.flags.f_contiguous,
    )
    assert got.tobytes(order="A") == want.tobytes(order="A")


def delivered(loader) -> np.ndarray:
    batches = list(loader)
    for b in batches:
        assert_paired(b)
    return np.concatenate([b["id"] for b in batches])


def truncate(path, keep: int) -> int:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return size


# -- the reader -----------------------------------------------------------------------------
ARRAYS = {
    "float32": np.random.default_rng(0).random((5, 6), dtype=np.float32),
    "fortran_big_endian": np.asfortranarray(np.arange(60, dtype=">i4").reshape(3, 4, 5)),
    "scalar": np.array(2.5),
    "empty": np.zeros((0, 3), np.int16),
    "structured": np.array([(1, (2.0, 3.0))], dtype=[("a", "<i4"), ("b", ">f8", (2,))]),
    "unicode": np.array(["héllo", "数据"]),
    "bool": np.array([[True], [False]]),
}


@pytest.mark.parametrize("kind", sorted(ARRAYS))
def test_read_npy_is_bit_identical_to_np_load(tmp_path, kind):
    path = tmp_path / f"{kind}.npy"
    np.save(path, ARRAYS[kind])
    got = read_npy(str(path))
    assert_same_array(got, np.load(path))
    assert got.flags.writeable and got.flags.owndata


def test_fortran_order_comes_back_right(tmp_path):
    a = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    np.save(tmp_path / "f.npy", a)
    got = read_npy(str(tmp_path / "f.npy"))
    assert got.flags.f_contiguous and not got.flags.c_contiguous
    np.testing.assert_array_equal(got, a)
    assert got[1, 2, 3] == 23


def test_object_npy_is_refused_without_running_its_pickle(tmp_path):
    class Boom:  # unpickling this object creates a file: a stand-in for arbitrary code
        def __init__(self, marker):
            self.marker = str(marker)

        def __reduce__(self):
            return (open, (self.marker, "w"))

    inputs, labels = write_pairs(tmp_path, 2)
    np.save(inputs / "0001.npy", np.array([Boom(tmp_path / "pwned")], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"0001\.npy.*dtype object.*never loads pickles"):
        NpyPairs(inputs, labels)[1]
    assert not (tmp_path / "pwned").exists()
    np.load(inputs / "0001.npy", allow_pickle=True)  # proof that the file really is hostile
    assert (tmp_path / "pwned").exists()


def test_hostile_header_is_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:  # claims 8 TB of data in a file of a few hundred bytes
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
        f.write(b"\0" * 64)
    with pytest.raises(DataError, match=r"huge\.npy: truncated: expected 8000000000\d+ bytes.*file has \d+"):
        read_npy(str(path))
    with open(path, "r+b") as f:  # a header length field pointing far past the end of the file
        f.seek(8)
        f.write(b"\xff\xff")
    with pytest.raises(DataError, match=r"huge\.npy: not a readable .npy file: the header claims 65545 bytes"):
        read_npy(str(path))


def test_not_an_npy_file_is_a_data_error_naming_it(tmp_path):
    (tmp_path / "text.npy").write_text("just some text, not an array")
    with pytest.raises(DataError, match=r"text\.npy: not a readable .npy file.*magic string"):
        read_npy(str(tmp_path / "text.npy"))


def test_truncated_npy_names_file_and_sizes(tmp_path):
    np.save(tmp_path / "t.npy", np.zeros(100, np.float32))
    size = truncate(tmp_path / "t.npy", 300)
    assert size == 528
    expected = r"t\.npy: truncated: expected 528 bytes \(header 128 \+ float32 \(100,\) data 400\), file has 300"
    with pytest.raises(DataError, match=expected):
        read_npy(str(tmp_path / "t.npy"))


def test_header_cache_is_shared_by_identical_headers_only(tmp_path):
    from steadyfeed.sources import npy

    npy._parse_header.cache_clear()
    for i in range(5):
        np.save(tmp_path / f"same{i}.npy", np.full((3, 2), i, np.float32))
    np.save(tmp_path / "other.npy", np.zeros((2, 3), np.float32))
    for i in range(5):
        np.testing.assert_array_equal(read_npy(str(tmp_path / f"same{i}.npy")), np.full((3, 2), i))
    np.testing.assert_array_equal(read_npy(str(tmp_path / "other.npy")), np.zeros((2, 3)))
    info = npy._parse_header.cache_info()
    assert (info.misses, info.hits) == (2, 4)


# -- NpyPairs: construction ---------------------------------------------------------------
def test_pairs_by_sorted_name(tmp_path):
    inputs, labels = tmp_path / "in", tmp_path / "lab"
    inputs.mkdir()
    labels.mkdir()
    for name, value in [("b.npy", 2), ("a.npy", 1), ("c.npy", 3)]:
        np.save(inputs / name, np.array([value]))
        np.save(labels / name, np.array(value * 10))
    (inputs / "notes.txt").write_text("ignored: not .npy")
    src = NpyPairs(inputs, labels)
    assert src.names == ["a.npy", "b.npy", "c.npy"]
    assert [(int(s["x"][0]), int(s["y"])) for s in (src[i] for i in range(3))] == [(1, 10), (2, 20), (3, 30)]
    assert src.locate(1) == f"{inputs / 'b.npy'}, {labels / 'b.npy'}"
    with pytest.raises(IndexError):
        src[3]


def test_unpaired_names_are_listed_with_counts(tmp_path):
    inputs, labels = write_pairs(tmp_path, 3)
    for i in range(12):
        np.save(inputs / f"extra{i:02d}.npy", np.zeros(1))
    np.save(labels / "orphan.npy", np.zeros(1))
    with pytest.raises(DataError) as info:
        NpyPairs(inputs, labels)
    message = str(info.value)
    assert f"12 file(s) in {inputs} have no match in {labels}: extra00.npy, " in message
    assert "extra09.npy, ..." in message and "extra10.npy" not in message  # first 10 only
    assert f"1 file(s) in {labels} have no match in {inputs}: orphan.npy" in message


def test_empty_directory_is_a_data_error(tmp_path):
    inputs, labels = write_pairs(tmp_path, 2)
    for path in labels.iterdir():
        path.unlink()
    with pytest.raises(DataError, match=f"labels directory {labels} has no .npy files"):
        NpyPairs(inputs, labels)


def test_missing_directory_names_it(tmp_path):
    inputs, _ = write_pairs(tmp_path, 2)
    with pytest.raises(FileNotFoundError, match=r"labels directory not found: .*nowhere"):
        NpyPairs(inputs, tmp_path / "nowhere")


def test_non_ascii_names_and_symlinks_just_work(tmp_path):
    (tmp_path / "real").mkdir()
    inputs, labels = write_pairs(tmp_path / "real", 3, name=lambda i: f"{i:02d}_échantillon_数据.npy")
    linked_inputs = tmp_path / "inputs_link"  # a symlinked directory
    linked_inputs.symlink_to(inputs, target_is_directory=True)
    labels_of_links = tmp_path / "labels_links"  # a directory of symlinked files
    labels_of_links.mkdir()
    for path in labels.iterdir():
        (labels_of_links / path.name).symlink_to(path)
    src = pickle.loads(pickle.dumps(NpyPairs(linked_inputs, labels_of_links)))
    assert src.names[2] == "02_échantillon_数据.npy"
    with Loader(src, 2, with_ids=True) as loader:
        assert sorted(delivered(loader).tolist()) == [0, 1, 2]


def test_broken_symlink_fails_loudly_on_read(tmp_path):
    inputs, labels = write_pairs(tmp_path, 2)
    (labels / "0001.npy").unlink()
    (labels / "0001.npy").symlink_to(tmp_path / "gone.npy")
    src = NpyPairs(inputs, labels)  # listed, not silently dropped
    with pytest.raises(FileNotFoundError, match="0001.npy"):
        src[1]


def test_fingerprint_changes_when_a_file_changes(tmp_path):
    inputs, labels = write_pairs(tmp_path, 3)
    src = NpyPairs(inputs, labels)
    before = src.fingerprint()
    assert before == NpyPairs(inputs, labels).fingerprint()
    np.save(labels / "0002.npy", np.zeros(7))
    assert src.fingerprint() != before


# -- NpyPairs through the Loader ----------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_pairs_exactly_once_through_workers(tmp_path, mode, no_leaks):
    n = 150
    inputs, labels = write_pairs(tmp_path, n, name=lambda i: f"{i:04d}_ü.npy")
    src = NpyPairs(inputs, labels)
    assert len(pickle.dumps(src)) < 100 * n  # names only, no data
    with Loader(src, 16, shuffle=True, seed=3, workers=2, mode=mode, with_ids=True) as loader:
        for epoch in range(2):
            assert sorted(delivered(loader).tolist()) == list(range(n)), epoch


def test_mismatched_shapes_in_one_batch_name_both_ids_files_and_shapes(tmp_path, no_leaks):
    inputs, labels = write_pairs(tmp_path, 6)
    np.save(inputs / "0004.npy", np.zeros((2, 3)))
    with Loader(NpyPairs(inputs, labels), 6, workers=2, mode="thread", on_error="skip") as loader:
        with pytest.raises(CollateError) as info:
            list(loader)
        assert loader.quarantine_report() == []  # neither file is to blame
    err = info.value
    assert err.sample_ids == (0, 4) and err.locations[1].startswith(str(inputs / "0004.npy"))
    assert (
        f"sample 4 ({inputs / '0004.npy'}, {labels / '0004.npy'}) has shape (2, 3) float64 but sample 0 " in str(err)
    ) and "the first of its batch, has shape (4,) float64" in str(err)


@pytest.mark.parametrize("mode", MODES)
def test_truncated_file_is_quarantined_and_the_rest_delivered_once(tmp_path, mode, no_leaks):
    n = 40
    inputs, labels = write_pairs(tmp_path, n)
    size = truncate(labels / "0007.npy", 130)  # the header survives, the data is cut
    with Loader(NpyPairs(inputs, labels), 8, workers=2, mode=mode, with_ids=True, on_error="skip") as loader:
        assert sorted(delivered(loader).tolist()) == sorted(set(range(n)) - {7})
        (entry,) = loader.quarantine_report()
    assert entry["sample_id"] == 7 and entry["error_type"] == "DataError"
    assert str(labels / "0007.npy") in entry["location"]
    assert f"0007.npy: truncated: expected {size} bytes" in entry["message"] and "file has 130" in entry["message"]


def test_truncated_data_raises_sample_error_naming_file_and_sizes(tmp_path, no_leaks):
    inputs, labels = write_pairs(tmp_path, 10)
    size = truncate(inputs / "0003.npy", 140)
    with Loader(NpyPairs(inputs, labels), 4, workers=2, mode="thread") as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert info.value.sample_id == 3 and info.value.attempts == 1
    assert f"0003.npy: truncated: expected {size} bytes" in str(info.value) and "file has 140" in str(info.value)


# -- NpyArray ----------------------------------------------------------------------------------
@pytest.fixture
def big(tmp_path):
    x = np.arange(500 * 6, dtype=np.float32).reshape(500, 6)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "f.npy", np.asfortranarray(x * 2))
    np.save(tmp_path / "y.npy", label_of(x))
    return tmp_path


def test_npyarray_rows_match_np_load_and_pickle_small(big):
    src = NpyArray(x=big / "x.npy", f=big / "f.npy", y=big / "y.npy")
    blob = pickle.dumps(src)
    assert len(blob) < 2000  # 24 KB of data did not travel
    back = pickle.loads(blob)
    full = {k: np.load(big / f"{k}.npy") for k in "xfy"}
    for i in (0, 123, 499):
        for key, arr in back[i].items():
            assert_same_array(arr, np.array(full[key][i]))
    ids = [400, 3, 3, 250, 0]  # unsorted, with a repeat
    for sample, i in zip(back.read_many(ids), ids):
        for key, arr in sample.items():
            np.testing.assert_array_equal(arr, full[key][i])
    assert back.locate(7) == f"row 7 of {big / 'x.npy'}, {big / 'f.npy'}, {big / 'y.npy'}"
    back.close()


def test_npyarray_lengths_must_match(big):
    np.save(big / "short.npy", np.zeros(499))
    with pytest.raises(DataError, match=r"same number of rows.*x\.npy': 500.*short\.npy': 499"):
        NpyArray(x=big / "x.npy", y=big / "short.npy")


def test_npyarray_refuses_missing_truncated_and_object_files(big):
    with pytest.raises(FileNotFoundError, match="nothing.npy"):
        NpyArray(x=big / "nothing.npy")
    src = NpyArray(y=big / "y.npy")
    truncate(big / "y.npy", 1000)
    with pytest.raises(DataError, match=r"y\.npy: truncated: expected 4128 bytes"):
        NpyArray(y=big / "y.npy")
    np.testing.assert_array_equal(src[0]["y"], label_of(np.arange(6, dtype=np.float32)[None])[0])  # still there
    with pytest.raises(
        DataError,
        match=r"y\.npy: rows 499\.\.499 end past the end of the file, now 1000 bytes "
        r"where its header needs 4128 \(cut short",
    ):
        src[499]  # cut after the source was built
    np.save(big / "obj.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"obj\.npy: holds Python objects"):
        NpyArray(x=big / "obj.npy")


SHRINK_SCRIPT = """
import os, sys
import numpy as np
from steadyfeed import Loader, SampleError
from steadyfeed.sources.npy import NpyArray
path = sys.argv[1]
rows = np.ones((1024, 1024), np.float32, order=sys.argv[3])
np.save(path, rows)  # 4 KB rows (C order): a row past the cut is a page past the end
loader = Loader(NpyArray(x=path), 16, workers=int(sys.argv[2]))
batches = iter(loader)
next(batches)
os.truncate(path, 128 + 4096)  # the header and one row remain: the mapping now reaches past the file
try:
    for _ in batches:
        pass
    print("no error")
except SampleError as error:
    print("SampleError", error)
loader.close()
"""


@pytest.mark.parametrize("workers,order", [(0, "C"), (2, "C"), (0, "F")])  # F: mapped, so checked between reads only
def test_npyarray_shrunk_while_in_use_raises_naming_the_file_instead_of_crashing(tmp_path, workers, order):
    # in a child: a regression would kill the process with SIGBUS, which must not take pytest along
    done = subprocess.run(
        [sys.executable, "-c", SHRINK_SCRIPT, str(tmp_path / "x.npy"), str(workers), order],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, f"rc {done.returncode} (SIGBUS is -7): {done.stderr[-2000:]}"
    assert done.stdout.startswith("SampleError sample ")
    assert "(row " in done.stdout and "x.npy: rows " in done.stdout
    assert "end past the end of the file, now 4224 bytes where its header needs 4194432" in done.stdout


@pytest.mark.parametrize("mode", MODES)
def test_npyarray_exactly_once_through_workers(big, mode, no_leaks):
    src = NpyArray(x=big / "x.npy", y=big / "y.npy")
    with Loader(src, 32, shuffle=True, workers=2, mode=mode, with_ids=True) as loader:
        batches = list(loader)
    for b in batches:
        np.testing.assert_array_equal(b["y"], label_of(b["x"]))
        np.testing.assert_array_equal(b["x"][:, 0] / 6, b["id"])
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(500))


# -- read_batch: the one-preadv-per-file path and its checked fallback ----------------------
def write_rows(root, arrays):
    root.mkdir(exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(root / f"{i:04d}.npy", a)
    return root


def batch_of(tmp_path, arrays, ids=None):
    inputs = write_rows(tmp_path / "inputs", arrays)
    labels = write_rows(tmp_path / "labels", [np.float32(i) for i in range(len(arrays))])
    src = NpyPairs(inputs, labels)
    ids = list(range(len(arrays))) if ids is None else ids
    return src.read_batch(ids), inputs


@pytest.mark.parametrize("kind", ["float32", "scalar", "structured", "unicode", "bool"])
def test_read_batch_matches_np_load_row_for_row(tmp_path, kind):
    rng = np.random.default_rng(1)
    base = ARRAYS[kind]
    arrays = [base if base.dtype.kind in "OUSVb" else (base + rng.integers(0, 9)).astype(base.dtype) for _ in range(7)]
    ids = [6, 0, 3, 3, 1]
    batch, inputs = batch_of(tmp_path, arrays, ids=ids)
    assert batch["x"].shape == (len(ids), *base.shape)
    for row, i in enumerate(ids):  # row by row: np.stack would make a structured dtype native-endian
        assert_same_array(batch["x"][row, ...], np.load(inputs / f"{i:04d}.npy"))
    np.testing.assert_array_equal(batch["y"], np.float32(ids))


def test_read_batch_reads_a_differently_written_header_through_the_checked_path(tmp_path):
    arrays = [np.full((3, 4), i, np.float32) for i in range(5)]
    _, inputs = batch_of(tmp_path, arrays)
    with open(inputs / "0002.npy", "wb") as f:  # the same array in format 2.0: another header, same data
        np.lib.format.write_array(f, arrays[2], version=(2, 0))
    batch = NpyPairs(inputs, tmp_path / "labels").read_batch(range(5))
    np.testing.assert_array_equal(batch["x"], np.stack(arrays))


def test_read_batch_refuses_a_later_fortran_file_of_the_same_shape(tmp_path):
    arrays = [np.arange(12, dtype=np.float64).reshape(3, 4) + i for i in range(4)]
    _, inputs = batch_of(tmp_path, arrays)
    np.save(inputs / "0002.npy", np.asfortranarray(arrays[2]))  # same shape, other memory order
    src = NpyPairs(inputs, tmp_path / "labels")
    with pytest.raises(ValueError, match="0002.npy"):
        src.read_batch(range(4))  # the engine then reads one by one: correct rows, see below
    with Loader(src, 4) as loader:
        np.testing.assert_array_equal(next(iter(loader))["x"], np.stack(arrays))


def spoil_length(path, damage: str, itemsize: int) -> None:
    """``damage`` "truncated": the file loses its last item; "trailing bytes": it gains a byte."""
    if damage == "truncated":
        truncate(path, os.path.getsize(path) - itemsize)
    else:
        with open(path, "ab") as f:
            f.write(b"\0")


@pytest.mark.parametrize("damage", ["truncated", "trailing bytes"])
def test_read_batch_names_a_later_file_of_the_wrong_length(tmp_path, damage):
    arrays = [np.full((8,), i, np.float64) for i in range(5)]
    _, inputs = batch_of(tmp_path, arrays)
    spoil_length(inputs / "0003.npy", damage, 8)
    with pytest.raises(DataError, match=f"0003.npy: {damage}"):
        NpyPairs(inputs, tmp_path / "labels").read_batch(range(5))


def test_read_batch_refuses_a_later_file_of_another_dtype_with_the_same_size(tmp_path):
    """int32 and float32 rows of one shape have headers of one length and data of one size:
    only comparing the headers byte for byte tells them apart."""
    arrays = [np.full((3, 4), i, np.float32) for i in range(4)]
    _, inputs = batch_of(tmp_path, arrays)
    np.save(inputs / "0001.npy", np.full((3, 4), 1, np.int32))
    with pytest.raises(ValueError, match=r"0001.npy: int32 \(3, 4\) differs from float32 \(3, 4\)"):
        NpyPairs(inputs, tmp_path / "labels").read_batch(range(4))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_read_batch_keeps_one_descriptor_per_directory_until_close(tmp_path):
    """A batch's files are opened relative to their directories: each process opens the two
    once and keeps them (never one per file); close() gives them back, a copy holds none."""
    inputs, labels = write_pairs(tmp_path, 50)
    src = NpyPairs(inputs, labels)
    before = open_fds()
    for start in range(0, 50, 10):
        assert src.read_batch(range(start, start + 10))["x"][0, 0] == start * WIDTH
    assert open_fds() == before + 2
    src.close()
    assert open_fds() == before
    copy = pickle.loads(pickle.dumps(src))  # holds its listing's mapping: count from here
    unpickled = open_fds()
    np.testing.assert_array_equal(copy.read_batch([3])["x"][0], x_of(3))  # opens its own
    assert open_fds() == unpickled + 2
    copy.close()
    assert open_fds() == unpickled


def test_read_batch_names_a_missing_file_by_its_full_path(tmp_path):
    inputs, labels = write_pairs(tmp_path, 4)
    src = NpyPairs(inputs, labels)
    (labels / "0002.npy").unlink()
    with pytest.raises(FileNotFoundError) as info:
        src.read_batch(range(4))
    assert info.value.filename == str(labels / "0002.npy")
    src.close()


def test_read_batch_where_files_cannot_be_opened_relative_to_a_directory(tmp_path, monkeypatch):
    """Windows' os.open takes no dir_fd: there the files are opened by their full paths."""
    from steadyfeed.sources import npy

    monkeypatch.setattr(npy, "_OPENAT", False)
    inputs, labels = write_pairs(tmp_path, 6, name=lambda i: f"{i:02d}_données.npy")
    src = NpyPairs(inputs, labels)
    before = open_fds()
    batch = src.read_batch([5, 1, 2])
    np.testing.assert_array_equal(batch["x"], np.stack([x_of(5), x_of(1), x_of(2)]))
    assert open_fds() == before
    (inputs / "01_données.npy").unlink()
    with pytest.raises(FileNotFoundError) as info:
        src.read_batch([0, 1])
    assert info.value.filename == str(inputs / "01_données.npy")


@pytest.mark.parametrize("first", ["another shape", "another dtype", "truncated", "trailing bytes", "fortran"])
def test_read_batch_checks_each_batchs_first_file_not_only_the_last_batchs_layout(tmp_path, first):
    """A batch's layout comes from its first file; where that file's header holds the bytes
    the last batch's first file had, nothing is parsed (``_Folder.layout``). A first file
    that differs, or that has those header bytes and the wrong length, is still read as
    itself or named: never taken for the last batch's layout."""
    arrays = [np.full((3, 4), i, np.float32) for i in range(8)]
    _, inputs = batch_of(tmp_path, arrays)
    src = NpyPairs(inputs, tmp_path / "labels")
    np.testing.assert_array_equal(src.read_batch(range(4))["x"], np.stack(arrays[:4]))  # the layout to remember
    path = inputs / "0004.npy"
    if first in ("truncated", "trailing bytes"):
        spoil_length(path, first, 4)
        with pytest.raises(DataError, match=f"0004.npy: {first}"):
            src.read_batch(range(4, 8))
        return
    if first == "fortran":
        np.save(path, np.asfortranarray(arrays[4]))
        with pytest.raises(ValueError, match="0004.npy: Fortran order"):
            src.read_batch(range(4, 8))
        return
    changed = [
        np.full((5,), i, np.float64) if first == "another shape" else np.full((3, 4), i, np.int32) for i in range(4, 8)
    ]
    for i, a in zip(range(4, 8), changed):
        np.save(inputs / f"{i:04d}.npy", a)
    np.testing.assert_array_equal(src.read_batch(range(4, 8))["x"], np.stack(changed))
    assert src.read_batch(range(4, 8))["x"].dtype == changed[0].dtype
    np.testing.assert_array_equal(src.read_batch(range(4))["x"], np.stack(arrays[:4]))  # and back
