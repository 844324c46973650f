"""Hdf5Source: named datasets of one HDF5 file, checked at construction, read lazily per process."""

import os
import pickle
import subprocess
import sys
import textwrap
from unittest import mock

import h5py
import numpy as np
import psutil
import pytest
from helpers import Recording, assert_paired, errors_in_threads, label_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

from steadyfeed import DataError, Loader, SampleError
from steadyfeed.sources import hdf5
from steadyfeed.sources.hdf5 import Hdf5Source

pytestmark = pytest.mark.timeout(60)

WIDTH = 4  # x row i holds i*WIDTH .. i*WIDTH+3, which assert_paired checks against the id


def paired_rows(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(start * WIDTH, stop * WIDTH, dtype=np.float64).reshape(-1, WIDTH)
    return x, label_of(x)


def write_paired(path, n: int, **dataset_options) -> str:
    x, y = paired_rows(0, n)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=x, **dataset_options)
        f.create_dataset("meta/labels", data=y)
    return str(path)


@pytest.fixture
def paired_file(tmp_path):
    return write_paired(tmp_path / "d.h5", 300, chunks=(16, WIDTH))


def _raw(src: Hdf5Source) -> dict:
    """Which datasets this process's handle reads by file offset (stored raw)."""
    with src._handles.use() as handle:
        return handle.raw


def delivered(loader) -> np.ndarray:
    batches = list(loader)
    for batch in batches:
        assert_paired(batch)
    return np.concatenate([b["id"] for b in batches])


# -- what it serves ---------------------------------------------------------------------------


def test_fields_are_named_after_the_arguments(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, (50, 8, 8, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("images", data=images, chunks=(16, 8, 8, 3))
        f["labels"] = np.arange(50, dtype=np.int64) * 7
    src = Hdf5Source(tmp_path / "d.h5", x="/images", y="/labels")
    assert len(src) == 50
    sample = src[17]
    assert sorted(sample) == ["x", "y"]
    assert sample["x"].dtype == np.uint8 and sample["x"].shape == (8, 8, 3)
    np.testing.assert_array_equal(sample["x"], images[17])
    assert sample["y"] == 17 * 7
    with pytest.raises(IndexError, match="out of range"):
        src[50]


@pytest.mark.parametrize("gap_bytes", [0, 100, hdf5.GAP_BYTES])  # runs only; runs and spans; spans
@pytest.mark.parametrize(
    "layout",
    [{}, {"chunks": (16, WIDTH)}, {"chunks": (16, WIDTH), "compression": "gzip"}],
    ids=["contiguous", "chunked", "gzip"],
)
def test_read_many_returns_per_sample_rows_for_shuffled_ids_with_repeats(tmp_path, layout, gap_bytes, monkeypatch):
    monkeypatch.setattr(hdf5, "GAP_BYTES", gap_bytes)
    src = Hdf5Source(write_paired(tmp_path / "d.h5", 300, **layout), x="/images", y="/meta/labels")
    rng = np.random.default_rng(1)
    ids = np.concatenate([rng.integers(0, 300, 40), [7, 7, 299, 0], np.arange(100, 120), rng.permutation(300)[:30]])
    rng.shuffle(ids)
    batch = src.read_many(ids)
    assert len(batch) == len(ids)
    expected_x, expected_y = paired_rows(0, 300)
    for i, sample in zip(ids, batch):
        np.testing.assert_array_equal(sample["x"], src[i]["x"])
        np.testing.assert_array_equal(sample["x"], expected_x[i])
        assert sample["y"] == src[i]["y"] == expected_y[i]


@pytest.mark.parametrize("gap_bytes", [0, hdf5.GAP_BYTES])
@pytest.mark.parametrize(
    "layout",
    [{}, {"chunks": (16, WIDTH)}, {"chunks": (16, WIDTH), "compression": "gzip"}],
    ids=["contiguous", "chunked", "gzip"],
)
def test_read_batch_puts_each_row_in_its_place_in_the_arrays_given(tmp_path, layout, gap_bytes, monkeypatch):
    monkeypatch.setattr(hdf5, "GAP_BYTES", gap_bytes)
    src = Hdf5Source(write_paired(tmp_path / "d.h5", 300, **layout), x="/images", y="/meta/labels")
    ids = np.random.default_rng(2).permutation(np.concatenate([np.arange(40, 60), [7, 7, 299, 0, 41]]))
    slot = Recording()
    batch = src.read_batch(ids, allocate=slot)
    assert len(slot.made) == 1 and all(batch[key] is slot.made[0][key] for key in ("x", "y"))
    expected_x, expected_y = paired_rows(0, 300)
    np.testing.assert_array_equal(batch["x"], expected_x[ids])
    np.testing.assert_array_equal(batch["y"], expected_y[ids])
    in_order = src.read_batch(np.arange(100, 132), allocate=slot)
    assert in_order["x"] is slot.made[1]["x"]
    np.testing.assert_array_equal(in_order["x"], expected_x[100:132])
    nothing = src.read_batch([])
    assert nothing["x"].shape == (0, WIDTH) and nothing["y"].shape == (0,) and src.read_many([]) == []
    src.close()


def test_concurrent_reads_from_threads_share_one_file_correctly(paired_file):
    src = Hdf5Source(paired_file, x="/images", y="/meta/labels")
    expected_x, _ = paired_rows(0, 300)

    def reader(seed):
        rng = np.random.default_rng(seed)
        for _ in range(40):
            ids = rng.integers(0, 300, 16)
            got = np.stack([s["x"] for s in src.read_many(ids)])
            np.testing.assert_array_equal(got, expected_x[ids])

    errors = errors_in_threads(reader, 4)
    src.close()
    assert errors == []


# -- through the loader -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_exactly_once_through_the_loader_with_shuffle(paired_file, mode, no_leaks):
    src = Hdf5Source(paired_file, x="/images", y="/meta/labels")
    with Loader(src, 32, shuffle=True, seed=3, workers=2, mode=mode, with_ids=True) as loader:
        for epoch in range(2):
            ids = delivered(loader.epoch(epoch))
            assert sorted(ids.tolist()) == list(range(300))


def test_an_unreadable_chunk_fails_its_samples_naming_file_dataset_and_rows(tmp_path, no_leaks):
    path = write_paired(tmp_path / "d.h5", 64, chunks=(16, WIDTH), compression="gzip")
    with h5py.File(path, "r") as f:
        chunk = f["images"].id.get_chunk_info(1)  # rows 16..31
    with open(path, "r+b") as raw:
        raw.seek(chunk.byte_offset)
        raw.write(b"\xff" * chunk.size)
    src = Hdf5Source(path, x="/images", y="/meta/labels")
    with pytest.raises(DataError, match=r"cannot read rows 20\.\.20 of dataset /images") as info:
        src[20]
    assert path in str(info.value)
    with Loader(src, 8, workers=2, mode="thread", on_error="skip", with_ids=True, max_error_fraction=0.5) as loader:
        ids = delivered(loader)
        report = loader.quarantine_report()
    assert sorted(ids.tolist()) == [i for i in range(64) if not 16 <= i < 32]
    assert len(report) == 16
    with Loader(src, 8) as loader, pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.sample_id == 16 and path in info.value.location
    assert isinstance(info.value.__cause__, DataError)


# -- construction-time checks -----------------------------------------------------------------


def test_length_mismatch_names_the_datasets_and_their_lengths(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["images"] = np.zeros((10, 2))
        f["labels"] = np.zeros(9)
    with pytest.raises(DataError, match="/images has 10 rows, /labels has 9 rows") as info:
        Hdf5Source(tmp_path / "d.h5", x="/images", y="/labels")
    assert str(tmp_path / "d.h5") in str(info.value)


def test_a_missing_dataset_is_named_with_the_datasets_that_exist(paired_file):
    with pytest.raises(DataError, match="no dataset /labels; datasets in the file: /images, /meta/labels") as info:
        Hdf5Source(paired_file, x="/images", y="/labels")
    assert paired_file in str(info.value)
    with pytest.raises(DataError, match="/meta is a group, not a dataset"):
        Hdf5Source(paired_file, x="/meta")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such HDF5 file") as info:
        Hdf5Source(tmp_path / "nope.h5", x="/images")
    assert info.value.filename == str(tmp_path / "nope.h5")


@pytest.mark.parametrize("damage,what", [("text", "is not an HDF5 file"), ("truncate", "truncated")])
def test_a_non_hdf5_or_truncated_file_is_a_clear_error(paired_file, damage, what):
    data = open(paired_file, "rb").read()
    with open(paired_file, "wb") as f:
        f.write(b"x,y\n1,2\n" if damage == "text" else data[: len(data) // 2])
    with pytest.raises(DataError, match=what) as info:
        Hdf5Source(paired_file, x="/images")
    assert paired_file in str(info.value)


# -- handles ----------------------------------------------------------------------------------


def test_pickle_carries_no_handle_and_reopens(paired_file):
    src = Hdf5Source(paired_file, x="/images", y="/meta/labels")
    src[5]  # the file is open now
    blob = pickle.dumps(src)  # h5py objects refuse to pickle: this fails if a handle travels
    assert len(blob) < 2000
    back = pickle.loads(blob)
    np.testing.assert_array_equal(back[5]["x"], src[5]["x"])
    back.close()
    src.close()


def test_close_releases_the_file_and_the_next_read_reopens(paired_file):
    me = psutil.Process()
    before = me.num_fds()
    src = Hdf5Source(paired_file, x="/images", y="/meta/labels")
    assert me.num_fds() == before  # construction checks the file, then closes it
    src[0]
    assert me.num_fds() > before
    src.close()
    assert me.num_fds() == before
    assert src[1]["y"] == label_of(paired_rows(1, 2)[0])[0]
    src.close()
    assert me.num_fds() == before


def test_fingerprint_follows_the_file_and_the_datasets(paired_file):
    a = Hdf5Source(paired_file, x="/images", y="/meta/labels")
    before = a.fingerprint()
    assert before == Hdf5Source(paired_file, x="/images", y="/meta/labels").fingerprint()
    assert before != Hdf5Source(paired_file, x="/images").fingerprint()
    write_paired(paired_file, 400)
    assert a.fingerprint() != before
    assert "row 7" in a.locate(7) and paired_file in a.locate(7)


# -- SWMR -------------------------------------------------------------------------------------

SWMR_WRITER = textwrap.dedent("""
    import sys, h5py, numpy as np
    with h5py.File(sys.argv[1], "w", libver="latest") as f:
        x = f.create_dataset("images", (0, 4), np.float64, maxshape=(None, 4), chunks=(16, 4))
        y = f.create_dataset("labels", (0,), np.float64, maxshape=(None,), chunks=(16,))
        f.swmr_mode = True
        for line in sys.stdin:  # "x 10": append 10 paired rows to /images; "y 10": to /labels
            name, count = line.split()
            ds = x if name == "x" else y
            n = ds.shape[0]
            rows = np.arange(n * 4, (n + int(count)) * 4, dtype=np.float64).reshape(-1, 4)
            ds.resize(n + int(count), axis=0)
            ds[n:] = rows if name == "x" else rows.sum(axis=1) * 3 + 1
            ds.flush()
            print(ds.shape[0], flush=True)
""")


def test_swmr_reads_a_file_still_being_written(tmp_path, no_leaks):
    path = str(tmp_path / "live.h5")
    with subprocess.Popen(
        [sys.executable, "-c", SWMR_WRITER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as writer:

        def append(name, count):
            writer.stdin.write(f"{name} {count}\n")
            writer.stdin.flush()
            return int(writer.stdout.readline())  # the writer has flushed

        append("x", 100), append("y", 100)
        with pytest.raises(DataError, match="swmr=True"):
            Hdf5Source(path, x="/images", y="/labels")
        src = Hdf5Source(path, swmr=True, x="/images", y="/labels")
        assert len(src) == 100
        with Loader(src, 16, shuffle=True, workers=2, mode="thread", with_ids=True) as loader:
            assert sorted(delivered(loader).tolist()) == list(range(100))
        assert src[99]["y"] == label_of(paired_rows(99, 100)[0])[0]  # the file is open in this process again
        append("x", 28), append("y", 28)
        assert len(Hdf5Source(path, swmr=True, x="/images", y="/labels")) == 100  # the shared file's lengths
        src.close()
        assert append("x", 28) == 156
        grown = Hdf5Source(path, swmr=True, x="/images", y="/labels")
        assert len(grown) == 128  # the rows both datasets have
        ids = np.array([127, 3, 126, 64])  # one read spanning chunks written after the first open
        assert_paired({key: np.stack([s[key] for s in grown.read_many(ids)]) for key in ("x", "y")} | {"id": ids})
        grown.close()
        writer.stdin.close()
        assert writer.wait(10) == 0


def test_uncompressed_rows_are_read_by_file_offset_and_match_h5py(tmp_path, no_leaks):
    """Contiguous and whole-row-chunked datasets bypass h5py's lock; the rest go through HDF5."""
    path = tmp_path / "layouts.h5"
    rows = np.arange(101 * 6, dtype=">f4").reshape(101, 2, 3)  # big-endian on disk survives the raw path
    with h5py.File(path, "w") as f:
        f.create_dataset("contiguous", data=rows)
        f.create_dataset("chunked", data=rows.astype("<i8"), chunks=(8, 2, 3))
        f.create_dataset("gzip", data=rows, chunks=(8, 2, 3), compression="gzip")
        f.create_dataset("part_rows", data=rows, chunks=(8, 1, 3))  # chunks split rows: not raw
        sparse = f.create_dataset("sparse", shape=rows.shape, dtype="f4", chunks=(8, 2, 3))
        sparse[:8] = rows[:8]  # unwritten chunks hold the fill value: HDF5 must serve them
    keys = {name: f"/{name}" for name in ("contiguous", "chunked", "gzip", "part_rows", "sparse")}
    src = Hdf5Source(path, **keys)
    ids = np.array([100, 3, 7, 8, 9, 64, 3, 0])
    batch = src.read_batch(ids)
    assert sorted(_raw(src)) == ["chunked", "contiguous"]
    with h5py.File(path, "r") as f:
        for name in keys:
            expected = np.stack([f[name][int(i)] for i in ids])
            np.testing.assert_array_equal(batch[name], expected)
            assert batch[name].dtype == f[name].dtype
    src.close()
    with Loader(src, 16, shuffle=True, workers=2, with_ids=True) as loader:
        for b in loader:
            np.testing.assert_array_equal(b["contiguous"], rows[b["id"]])


# -- reads by file offset: every raw layout, bit for bit ---------------------------------------

N_RAW = 203  # not a multiple of any chunk size below: every chunked dataset ends in a partial chunk


def _write_chunks(datasets: dict, data: dict, order) -> None:
    """Chunk by chunk, chunk ``k`` of every dataset in turn, in ``order``: HDF5 allocates file
    space as chunks are written, so this sets where each chunk lies in the file."""
    for k in order:
        for name, ds in datasets.items():
            rows = slice(k * ds.chunks[0], (k + 1) * ds.chunks[0])
            ds[rows] = data[name][rows]


@pytest.fixture(scope="module")
def raw_layouts(tmp_path_factory):
    """A source over one file holding a dataset of every raw-readable layout, and their rows as h5py reads them."""
    path = tmp_path_factory.mktemp("raw") / "raw.h5"
    rng = np.random.default_rng(11)
    data = {
        "contiguous": rng.standard_normal((N_RAW, 5, 3)).astype(">f4"),  # big-endian on disk
        "images": rng.integers(0, 256, (N_RAW, 64, 64, 3), dtype=np.uint8),  # 12 KB rows, in-order chunks
        "labels": rng.integers(-(2**62), 2**62, N_RAW, dtype=np.int64),  # 8-byte scalar rows, contiguous
        "chunked_labels": rng.integers(-(2**62), 2**62, N_RAW, dtype=np.int64),
        "reversed": rng.integers(-(2**15), 2**15, (N_RAW, 7), dtype=np.int16),
        "interleaved_a": rng.integers(0, 2**32, (N_RAW, 3), dtype=np.uint32),
        "interleaved_b": rng.standard_normal((N_RAW, 3)),
    }
    with h5py.File(path, "w", rdcc_nbytes=0) as f:  # no chunk cache: chunks reach the file as written
        f.create_dataset("contiguous", data=data["contiguous"])
        f.create_dataset("images", data=data["images"], chunks=(32, 64, 64, 3))
        f.create_dataset("labels", data=data["labels"])
        f.create_dataset("chunked_labels", data=data["chunked_labels"], chunks=(16,))
        rev = f.create_dataset("reversed", (N_RAW, 7), np.int16, chunks=(8, 7))
        _write_chunks({"reversed": rev}, data, reversed(range(-(-N_RAW // 8))))
        pair = {
            name: f.create_dataset(name, (N_RAW, 3), data[name].dtype, chunks=(8, 3))
            for name in ("interleaved_a", "interleaved_b")
        }
        _write_chunks(pair, data, range(-(-N_RAW // 8)))
    with h5py.File(path, "r") as f:
        read = {name: f[name][()] for name in data}  # the reference: what h5py reads
    assert_bit_exact(read, data)
    src = Hdf5Source(path, **{name: f"/{name}" for name in data})
    raw = _raw(src)  # the layouts these tests claim to cover are the ones written
    assert sorted(raw) == sorted(data)
    assert raw["contiguous"].rows_per_chunk == N_RAW and len(raw["contiguous"].offsets) == 1
    assert (np.diff(raw["reversed"].offsets) < 0).all()  # chunks lie in the file last to first
    for name in ("reversed", "interleaved_a", "interleaved_b"):  # no two chunks adjacent in row order
        assert len(np.unique(raw[name].extents)) == len(raw[name].offsets) > 1
    assert all(N_RAW % raw[name].rows_per_chunk for name in data if name not in ("contiguous", "labels"))
    yield src, path, read
    src.close()


def assert_bit_exact(batch: dict, expected: dict) -> None:
    assert sorted(batch) == sorted(expected)
    for name, rows in expected.items():
        assert batch[name].dtype == rows.dtype and batch[name].shape == rows.shape, name
        assert batch[name].tobytes() == rows.tobytes(), name


def ids_with_runs():
    """Shuffled ids: single ids and runs of consecutive ones (often across chunk boundaries),
    overlapping at times, so repeats come too."""
    run = st.builds(
        lambda start, n: list(range(start, min(start + n, N_RAW))), st.integers(0, N_RAW - 1), st.integers(1, 70)
    )
    return st.lists(run, min_size=1, max_size=8).map(lambda runs: sum(runs, [])).flatmap(st.permutations)


@pytest.mark.parametrize("gap_bytes", [0, 100, hdf5.GAP_BYTES, 10**9])  # runs only ... one span per extent
@settings(max_examples=40, deadline=None)
@given(ids=ids_with_runs())
@example(ids=list(range(N_RAW))[::-1])
@example(ids=[N_RAW - 1, 0, N_RAW - 1, 7, 8, 7])
def test_raw_reads_match_h5py_bit_for_bit(raw_layouts, gap_bytes, ids):
    src, _, data = raw_layouts
    slot = Recording()
    with mock.patch.object(hdf5, "GAP_BYTES", gap_bytes):
        batch = src.read_batch(ids)
        into = src.read_batch(ids, allocate=slot)
    expected = {name: rows[ids] for name, rows in data.items()}
    assert_bit_exact(batch, expected)
    assert_bit_exact(into, expected)
    assert all(into[name] is slot.made[0][name] for name in data)


@pytest.mark.parametrize(
    "ids",
    [
        [15, 16, 31, 32, 33, 8, 7],  # across chunk boundaries of every chunk size
        [N_RAW - 1, N_RAW - 12, N_RAW - 11, 190, 191, 192],  # into and inside the partial last chunk
        [5, 5, 5, 100, 5, 0, 100],  # repeats
        list(range(40, 200)),  # one long run over many chunks (one read where they lie in order)
        list(np.random.default_rng(3).permutation(N_RAW)[:32]),  # a shuffled batch
    ],
)
def test_raw_reads_match_h5py_reading_the_sorted_ids(raw_layouts, ids):
    src, path, data = raw_layouts
    unique, inverse = np.unique(ids, return_inverse=True)
    with h5py.File(path, "r") as f:
        expected = {name: f[name][unique][inverse] for name in data}  # h5py reads increasing ids
    assert_bit_exact(src.read_batch(ids), expected)


def test_raw_reads_take_one_syscall_per_span_not_per_row(raw_layouts, monkeypatch):
    """Nearby rows share a read, across chunk boundaries where chunks lie back to back in the file,
    never across a jump in the file."""
    src, path, data = raw_layouts
    raw = _raw(src)
    calls = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: calls.append(offset) or preadv(fd, buffers, offset))

    def reads(name, ids):
        one = Hdf5Source(path, x=f"/{name}")
        calls.clear()
        assert_bit_exact(one.read_batch(ids), {"x": data[name][ids]})
        one.close()
        return len(calls)

    shuffled = np.random.default_rng(4).permutation(N_RAW)[:32]
    assert reads("labels", shuffled) == 1  # 8-byte rows a few hundred bytes apart: one read of their span
    extents, chunks = raw["chunked_labels"].extents[shuffled // 16], shuffled // 16
    assert reads("chunked_labels", shuffled) == len(np.unique(extents)) < len(np.unique(chunks))
    assert raw["images"].extents.max() == 0  # written in order at creation: chunks back to back
    assert reads("images", np.arange(10, 150)) == 1  # consecutive 12 KB rows over 5 chunks
    assert reads("reversed", np.arange(10, 30)) == 3  # chunks 1..3, stored last to first: one read each
    assert reads("images", [150, 3, 40, 41, 42, 100]) == 4  # 12 KB rows far apart: one read each (40..42 one)
    assert reads("images", [150, 42, 3, 40, 41, 100]) == 4  # the run 40..42 too, each row to its place


def test_a_shuffled_batch_is_read_straight_into_its_rows(raw_layouts, monkeypatch):
    """In file order, each row into its place in the batch: no sorted batch reordered after
    (a second batch-sized array, which costs a fresh batch's page faults each time)."""
    _, path, data = raw_layouts
    src, slot = Hdf5Source(path, x="/images"), Recording()
    ids = [150, 42, 3, 40, 41, 100]
    out = slot({"x": ((len(ids), 64, 64, 3), np.uint8)})["x"]
    buffers = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, offset: buffers.extend(bufs) or preadv(fd, bufs, offset))
    batch = src.read_batch(ids, allocate=lambda specs: {"x": out})
    assert batch["x"] is out
    assert_bit_exact(batch, {"x": data["images"][ids]})
    assert len(buffers) == len(ids) and all(np.shares_memory(np.frombuffer(b, np.uint8), out) for b in buffers)
    src.close()


@pytest.mark.parametrize("ids", [[40], [40, 42]], ids=["run", "span"])
def test_a_file_truncated_after_opening_fails_naming_the_rows(tmp_path, ids):
    path = str(tmp_path / "t.h5")
    rows = np.arange(64 * 6, dtype=np.float64).reshape(64, 6)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rows, chunks=(8, 6))
    src = Hdf5Source(path, x="/x")
    np.testing.assert_array_equal(src.read_batch(ids)["x"], rows[ids])  # opens the file
    raw = _raw(src)["x"]
    assert raw.rows_per_chunk == 8 and 40 % 8 == 0
    os.truncate(path, int(raw.offsets[40 // 8]) + 20)  # mid-row 40: the first read comes back short
    with pytest.raises(
        DataError,
        match=rf"rows 40\.\.{ids[-1]} of dataset /x end past the end of the file "
        r"\(truncated since it was opened\?\)",
    ) as info:
        src.read_batch(ids[::-1])
    assert path in str(info.value)
    np.testing.assert_array_equal(src.read_batch([0, 7, 1])["x"], rows[[0, 7, 1]])  # rows before the cut still read
    src.close()
