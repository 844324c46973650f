"""ParquetSource on files pyarrow writes itself: row groups read on demand, many files as one
source, column kinds, nulls, bad input, exactly once and bit-identical across workers and modes."""

import pickle

import numpy as np
import pytest
from helpers import epoch_digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadyfeed import DataError, Loader
from steadyfeed.sources.parquet import ParquetSource

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.timeout(90)

N = 100
MODES = [(0, "thread"), (2, "thread"), (2, "process")]


def table(start: int, n: int):
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "x": pa.array(ids.astype(np.float32)),
            "y": pa.array(ids * 3 + 1),  # int64: a function of x, so pairs are checked
            "vec": pa.array([[i, i + 0.5, -i] for i in ids.tolist()], pa.list_(pa.float32(), 3)),
            "grid": pa.array([[[i, 1], [2, 3]] for i in ids.tolist()], pa.list_(pa.list_(pa.int16(), 2), 2)),
            "tokens": pa.array([list(range(i % 4)) for i in ids.tolist()], pa.list_(pa.int64())),
            "name": pa.array([f"row-{i}" for i in ids.tolist()]),
            "blob": pa.array([bytes([i % 256]) * (i % 3) for i in ids.tolist()], pa.binary()),
        }
    )


@pytest.fixture
def files(tmp_path):
    """Two files written by pyarrow.parquet.write_table: 60 rows in row groups of 16, then 40 in groups of 7."""
    root = tmp_path / "data"
    root.mkdir()
    pq.write_table(table(0, 60), root / "part-0.parquet", row_group_size=16)
    pq.write_table(table(60, 40), root / "part-1.parquet", row_group_size=7)
    (root / "_SUCCESS").write_text("")  # what Spark leaves beside its output: not data
    return root


def test_rows_equal_what_pyarrow_reads(files):
    src = ParquetSource(files)
    expected = pa.concat_tables([pq.read_table(p) for p in sorted(files.glob("*.parquet"))]).to_pylist()
    assert len(src) == N and [p.rsplit("/", 1)[1] for p in src.paths] == ["part-0.parquet", "part-1.parquet"]
    for i in (0, 15, 16, 59, 60, 66, 99):
        sample, row = src[i], expected[i]
        assert sample["x"] == row["x"] and sample["x"].dtype == np.float32 and int(sample["y"]) == row["y"]
        assert sample["vec"].tolist() == row["vec"] and sample["grid"].tolist() == row["grid"]
        assert sample["tokens"].tolist() == row["tokens"] and sample["name"] == row["name"]
        assert sample["blob"] == row["blob"]
    assert src.locate(66) == f"{files / 'part-1.parquet'} row 6 (row group 0)"
    src.close()


def test_only_the_needed_row_groups_are_read(files, monkeypatch):
    reads = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        pq.ParquetFile,
        "read_row_group",
        lambda self, i, **kw: reads.append((i, tuple(kw["columns"]))) or real(self, i, **kw),
    )
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("a whole file was read"))
    src = ParquetSource(files, x="x", y="y")
    batch = src.read_batch([20, 21, 70, 17])  # row group 1 of part-0, row group 1 of part-1
    assert batch["x"].tolist() == [20, 21, 70, 17] and batch["y"].tolist() == [61, 64, 211, 52]
    assert reads == [(1, ("x", "y")), (1, ("x", "y"))]  # each group once, only the columns asked for
    src[18]  # the same group again: from the per-process cache
    assert len(reads) == 2
    src.close()


@pytest.mark.parametrize("workers,mode", MODES)
def test_exactly_once_and_bit_identical_across_workers_and_modes(files, workers, mode, no_leaks):
    def run(w, m):
        source = ParquetSource(files, x=["x", "y"], v="vec", y="y")
        with Loader(source, 8, shuffle=True, seed=5, workers=w, mode=m, with_ids=True) as loader:
            return list(loader)

    batches = run(workers, mode)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(N))
    for b in batches:  # every row with its own label
        assert (b["y"] == b["x"][:, 0] * 3 + 1).all() and (b["x"][:, 1] == b["y"]).all()
    assert epoch_digest(batches) == epoch_digest(run(0, "thread"))


def test_variable_length_lists_batch_with_pad(files, no_leaks):
    src = ParquetSource(files, tokens="tokens", y="y")
    assert src.read_batch is None  # no stacked batch: the loader's collate policy applies
    with Loader(src, 10, collate="pad", workers=2, mode="process", with_ids=True) as loader:
        batches = list(loader)
    for b in batches:
        assert (b["tokens_shape"][:, 0] == b["id"] % 4).all()


def test_nulls_are_nan_in_floats_else_named_unless_filled(tmp_path):
    pq.write_table(
        pa.table({"f": pa.array([1.5, None, 3.0]), "i": pa.array([1, None, 3]), "s": pa.array(["a", None, "c"])}),
        tmp_path / "n.parquet",
        row_group_size=2,
    )
    assert np.isnan(ParquetSource(tmp_path / "n.parquet", f="f")[1]["f"])
    src = ParquetSource(tmp_path / "n.parquet")
    assert src[2]["i"] == 3
    with pytest.raises(
        DataError,
        match=r"n.parquet row 1 \(row group 0\): column 'i' \(int64\) is null; "
        r"pass fill=\{'i': value\}",
    ):
        src[1]
    filled = ParquetSource(tmp_path / "n.parquet", fill={"i": -1, "s": ""})
    assert int(filled[1]["i"]) == -1 and filled[1]["s"] == ""
    assert ParquetSource(tmp_path / "n.parquet", i="i", fill={"i": -1}).read_batch([1, 0])["i"].tolist() == [-1, 1]


def test_bad_input_is_named(files, tmp_path):
    with pytest.raises(DataError, match=r"part-0.parquet: key 'x': expected columns \['nope'\], the file has"):
        ParquetSource(files, x="nope")
    pq.write_table(table(0, 5).set_column(0, "x", pa.array(np.arange(5.0))), tmp_path / "other.parquet")
    with pytest.raises(DataError, match=r"other.parquet: column 'x' is double, expected float \(as in .*part-0"):
        ParquetSource([files / "part-0.parquet", tmp_path / "other.parquet"], x="x")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="junk.parquet: not a readable Parquet file"):
        ParquetSource(tmp_path / "junk.parquet")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="holds no Parquet files"):
        ParquetSource(tmp_path / "nothing")
    with pytest.raises(DataError, match=r"key 'v': a list of columns stacks numbers; \['name'\] are not"):
        ParquetSource(files, v=["x", "name"])
    with pytest.raises(IndexError):
        ParquetSource(files)[N]


def test_a_damaged_row_group_names_the_file_and_group(files, tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(table(0, 40), path, row_group_size=20, compression="NONE")
    src = ParquetSource(path, x="x")
    data = bytearray(path.read_bytes())
    meta = pq.read_metadata(path)
    start = meta.row_group(1).column(0).data_page_offset
    data[start : start + 64] = b"\xff" * 64  # the second group's first page header
    path.write_bytes(bytes(data))
    fresh = ParquetSource(path, x="x")
    assert fresh[3]["x"] == 3  # the other group reads
    with pytest.raises(DataError, match=r"plain.parquet row group 1: cannot be read"):
        fresh[25]
    src.close()


def test_pickles_without_handles_or_decoded_groups(files):
    src = ParquetSource(files, x="x")
    src[3]
    copy = pickle.loads(pickle.dumps(src))
    assert copy._cache._groups == {} and copy[3]["x"] == 3 and copy.fingerprint() == src.fingerprint()
    assert ParquetSource(files, y="x").fingerprint() != src.fingerprint()
    src.close()
    copy.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, N - 1), max_size=20))
def test_a_batched_read_equals_the_rows_read_one_by_one(files, ids):
    src = ParquetSource(files, x=["x", "y"], v="vec", g="grid")
    batch = src.read_batch(ids)  # any ids, group boundaries and repeats included
    for key in ("x", "v", "g"):
        expected = np.stack([src[i][key] for i in ids]) if ids else np.empty(0)
        np.testing.assert_array_equal(batch[key], expected)
        assert batch[key].dtype == expected.dtype or not ids
    src.close()
