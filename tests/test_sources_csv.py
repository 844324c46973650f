"""CsvSource: a cached row-offset index gives csv.reader's rows by random access, and bad rows
are named by file and line."""

import csv
import json
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
from helpers import assert_paired, epoch_digest, label_of

from steadyfeed import DataError, Loader, SampleError
from steadyfeed.sources import csv_rows
from steadyfeed.sources.csv_rows import SUFFIX, CsvSource

pytestmark = pytest.mark.timeout(60)

WIDTH = 4
FEATURES = ["a", "b", "c", "d"]


def write(path, text):
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def reference_rows(path):
    """What csv.reader makes of the whole file: the rows after the header, blank lines left out."""
    with open(path, newline="", encoding="utf-8") as f:
        return [row for row in csv.reader(f) if row][1:]


def write_paired(path, n):
    """Row i: x = 4i .. 4i+3 (exact in float32), a quoted note with a comma, a quote and a line
    break in every third row, y = label_of(x)."""
    x = np.arange(n * WIDTH, dtype=np.float32).reshape(n, WIDTH)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["note", *FEATURES, "y"])
        for i, (row, y) in enumerate(zip(x, label_of(x))):
            w.writerow([f'row {i}, "quoted"\nsecond line' if i % 3 == 0 else "plain", *map(int, row), int(y)])
    return str(path)


def paired(path):
    return CsvSource(path, x=FEATURES, y="y", dtypes={"y": "float64"})


@pytest.fixture
def unicode_dir(tmp_path):
    d = tmp_path / "données été"
    d.mkdir()
    return d


# -- the index: rows equal csv.reader's ---------------------------------------------------------


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("trailing", ["", "\n", "\n\n"])
def test_rows_equal_csv_reader(tmp_path, newline, trailing):
    rng = np.random.default_rng(len(newline) * 10 + len(trailing))
    alphabet = list("ab é,\"'\n;") + ["\r\n"]  # a lone CR is refused (see test_construction_errors)
    rows = [[str(i), "".join(rng.choice(alphabet, rng.integers(0, 8))), str(i * 2)] for i in range(300)]
    path = str(tmp_path / "mixed.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator=newline)
        w.writerow(["id", "text", "twice"])
        for i, row in enumerate(rows):
            w.writerow(row)
            if i % 50 == 7:
                f.write(newline)  # blank lines are no rows
    with open(path, "r+b") as f:  # the last row ends in `trailing`, not in the writer's terminator
        f.truncate(os.path.getsize(path) - len(newline))
        f.seek(0, 2)
        f.write(trailing.replace("\n", newline).encode())
    src = CsvSource(path, i="id", v=["id", "twice"], dtypes={"i": "int64"})
    assert reference_rows(path) == rows
    assert [src.fields(i) for i in range(len(src))] == rows
    assert src[123]["i"] == 123 and src[123]["i"].dtype == np.int64
    np.testing.assert_array_equal(src[299]["v"], np.array([299, 598], np.float32))


def test_locate_gives_the_line_where_the_row_starts(tmp_path):
    path = write(tmp_path / "lines.csv", 'a,t\n1,"two\nlines"\n\n2,x\n3,"x\n\ny"\n4,z')
    src = CsvSource(path, a="a")
    assert [src.locate(i) for i in range(4)] == [f"{path}:{n}" for n in (2, 5, 6, 9)]


def test_fast_and_csv_scans_agree_on_quote_free_data(tmp_path):
    path = write(tmp_path / "plain.csv", "h\n1\n\n2\r\n\r\n3\n4\n\n5")
    dialect = CsvSource(path, h="h").dialect
    fast = csv_rows._scan_newlines(path, dialect, 2, 2)
    exact = csv_rows._scan_records(path, dialect, 2, 2)
    assert fast is not None
    for a, b in zip(fast, exact):
        np.testing.assert_array_equal(a, b)
    assert fast[1].tolist() == [2, 4, 6, 7, 9]
    assert csv_rows._scan_newlines(write(tmp_path / "q.csv", 'h\n"1"\n'), dialect, 2, 2) is None


def test_read_many_equals_one_by_one_and_reads_consecutive_rows_at_once(tmp_path, monkeypatch):
    src = paired(write_paired(tmp_path / "p.csv", 50))
    reads = []
    real = src._pread
    monkeypatch.setattr(src, "_pread", lambda *a: reads.append(a) or real(*a))
    for ids, preads in (([3, 4, 5, 6], 1), ([9, 2, 40], 3), ([49], 1)):
        reads.clear()
        batch = src.read_many(ids)
        assert len(reads) == preads
        for got, i in zip(batch, ids):
            np.testing.assert_array_equal(got["x"], src[i]["x"])
            np.testing.assert_array_equal(got["x"], np.arange(4 * i, 4 * i + 4))


def test_concurrent_reads_from_threads_share_one_handle(tmp_path):
    src = paired(write_paired(tmp_path / "p.csv", 300))
    ids = np.random.default_rng(0).integers(0, 300, (8, 400))

    def read(chunk):
        return all(src[int(i)]["x"][0] == 4 * i for i in chunk) and src.read_many(chunk[:50])[7]["x"][0] == 4 * chunk[7]

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, ids))
    assert src._handles.open_count() == 1
    src.close()


def test_utf8_bom_and_headerless_positions(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfa,b\n1,2\n")
    assert CsvSource(path, a="a")[0]["a"] == 1
    src = CsvSource(write(tmp_path / "nohead.csv", "1,2,3\n4,5,6\n"), header=False, x=[0, 2], y=1)
    assert len(src) == 2 and src[1]["x"].tolist() == [4, 6] and src[1]["y"] == 5


# -- the cache ------------------------------------------------------------------------------------


def counting_scanners(monkeypatch):
    calls = []
    for name in ("_scan_newlines", "_scan_records"):
        real = getattr(csv_rows, name)
        monkeypatch.setattr(csv_rows, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls


def test_cache_is_reused_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    path = write_paired(tmp_path / "p.csv", 30)
    calls = counting_scanners(monkeypatch)
    assert len(paired(path)) == 30 and calls == ["_scan_newlines", "_scan_records"]  # quotes: the exact scan
    assert os.path.exists(path + SUFFIX)
    calls.clear()
    assert len(paired(path)) == 30 and calls == []  # no rescan
    with open(path, "a", newline="") as f:
        f.write("late,0,1,2,3,19\n")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    src = paired(path)
    assert len(src) == 31 and calls and src[30]["y"] == 19


def test_same_size_rewrite_rebuilds_the_index(tmp_path):
    path = write(tmp_path / "s.csv", "a\n1\n22\n333\n")
    assert CsvSource(path, a="a")[1]["a"] == 22
    st = os.stat(path)
    write(path, "a\n333\n22\n1\n")  # same size, other row boundaries: only the mtime tells
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert os.path.getsize(path) == st.st_size
    src = CsvSource(path, a="a")
    assert [src[i]["a"] for i in range(3)] == [333, 22, 1]


def test_cache_dir_holds_the_index(tmp_path):
    path = write_paired(tmp_path / "p.csv", 10)
    cache = tmp_path / "cache"
    src = CsvSource(path, x=FEATURES, cache_dir=cache)
    assert len(src) == 10 and not os.path.exists(path + SUFFIX)
    assert [p.name for p in cache.iterdir()] == [os.path.basename(src._cache)]
    assert src._cache.endswith(SUFFIX)


def test_unsavable_index_warns_and_travels_with_the_source(tmp_path, no_leaks):
    path = write_paired(tmp_path / "p.csv", 40)
    os.mkdir(path + SUFFIX)  # something that cannot be replaced by a file, even by root
    with pytest.warns(UserWarning, match="could not save the index"):
        src = paired(path)
    with Loader(src, 16, workers=1, mode="process", with_ids=True) as loader:
        ids = np.concatenate([b["id"] for b in loader])
    assert ids.tolist() == list(range(40))


def test_a_file_changed_after_indexing_is_refused(tmp_path):
    path = write(tmp_path / "c.csv", "a\n1\n2\n")
    src = CsvSource(path, a="a")
    assert src[1]["a"] == 2
    src.close()
    write(path, "a\n3\n4\n5\n")
    with pytest.raises(DataError, match="changed since it was indexed"):
        src[1]


# -- errors name the file, the line and what was expected ----------------------------------------


def test_construction_errors(tmp_path):
    path = write(tmp_path / "h.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(DataError, match=r"expected columns \['x', 'z'\] in the header, available: \['a', 'b', 'c'\]"):
        CsvSource(path, f=["a", "x"], g="z")
    with pytest.raises(DataError, match="expected a header line naming the columns, found an empty file"):
        CsvSource(write(tmp_path / "empty.csv", ""), a="a")
    with pytest.raises(ValueError, match="dtypes are per key"):
        CsvSource(path, x=["a"], dtypes={"a": "int64"})
    with pytest.raises(ValueError, match="integer or float"):
        CsvSource(path, x="a", dtypes={"x": "bool"})
    with pytest.raises(DataError, match=r"cr\.csv:2: expected utf-8 CSV: new-line character seen in unquoted field"):
        CsvSource(write(tmp_path / "cr.csv", "a\n1\r2\n3\n"), a="a")
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        CsvSource(tmp_path / "missing.csv", x="a")


def test_header_only_is_empty(tmp_path, no_leaks, monkeypatch):
    path = write(tmp_path / "h.csv", "a,b\n\n")
    assert len(CsvSource(path, x=["a", "b"])) == 0
    calls = counting_scanners(monkeypatch)
    src = CsvSource(path, x=["a", "b"])
    assert len(src) == 0 and calls == []  # an empty index is cached too
    with Loader(src, 4, workers=2, mode="thread") as loader:
        assert list(loader) == []


def test_runaway_rows_are_refused_at_indexing(tmp_path):
    with pytest.raises(DataError, match=r"u\.csv:3: expected rows of at most max_row_bytes=64 .*unclosed quote"):
        CsvSource(write(tmp_path / "u.csv", 'a,b\n1,x\n2,"never closed\n' + "3,y\n" * 40), a="a", max_row_bytes=64)
    with pytest.raises(DataError, match=r"l\.csv:3: expected rows of at most max_row_bytes=64"):
        CsvSource(write(tmp_path / "l.csv", "a\n1\n" + "9" * 200 + "\n"), a="a", max_row_bytes=64)


@pytest.mark.parametrize(
    "row,dtype,expected",
    [
        ("1,2", "float32", "expected 3 fields (as in the header), found 2"),
        ("1,2,3,4", "float32", "expected 3 fields (as in the header), found 4"),
        (
            "1,abc,3",
            "float32",
            "column 'b': expected float32, found 'abc'; text labels read as class ids with dtypes={'v': 'class'}",
        ),
        ("1,1e40,3", "float32", "column 'b': expected float32, found '1e40' (out of range)"),
        ("1,3.5,3", "int64", "column 'b': expected int64, found '3.5'"),
        ("1,300,3", "int8", "column 'b': expected int8, found '300' (out of range)"),
        (
            "1,,3",
            "int64",
            "column 'b': missing value '': int64 has no NaN; pass fill={'v': value} for missing values, "
            "or read it as float32 (NaN)",
        ),
        (
            "1,NA,3",
            "int16",
            "column 'b': missing value 'NA': int16 has no NaN; pass fill={'v': value} for missing "
            "values, or read it as float32 (NaN)",
        ),
        ("1,2.0001,3", "int64", "column 'b': expected int64, found '2.0001'"),
        ("1,128.0,3", "int8", "column 'b': expected int8, found '128.0' (out of range)"),
    ],
)
def test_bad_rows_name_file_line_and_expectation(tmp_path, row, dtype, expected):
    path = write(tmp_path / "bad.csv", f'a,b,c\n1,2,3\n"multi\nline",5,6\n{row}\n7,8,9\n')
    src = CsvSource(path, v=["a", "b"] if dtype == "float32" else "b", dtypes={"v": dtype})
    src[3]
    with pytest.raises(DataError) as info:
        src[2]
    assert str(info.value) == f"{path}:5: {expected}"


def test_bad_rows_through_the_loader_raise_or_are_quarantined(tmp_path, no_leaks):
    path = write_paired(tmp_path / "p.csv", 30)
    with open(path, newline="") as f:
        text = f.read()
    text = text.replace("\nplain,20,21,22,23,", "\nplain,20,21,22,")  # row 5 loses a field
    write(path, text.replace(",33,34,35,", ",33,x,35,"))  # row 8 gets a word for a number
    with Loader(paired(path), 4, workers=2, mode="thread") as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert info.value.sample_id == 5 and info.value.location == f"{path}:9"  # rows 0 and 3 take two lines
    assert f"{path}:9: expected 6 fields (as in the header), found 5" in str(info.value)
    with Loader(
        paired(path), 4, shuffle=True, workers=2, mode="thread", on_error="skip", max_error_fraction=0.5, with_ids=True
    ) as loader:
        batches = list(loader)
        report = loader.quarantine_report()
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == [i for i in range(30) if i not in (5, 8)]
    assert sorted((r["sample_id"], r["location"]) for r in report) == [(5, f"{path}:9"), (8, f"{path}:13")]
    assert "column 'c': expected float32, found 'x'" in [r["message"] for r in report if r["sample_id"] == 8][0]


# -- through the loader, and across processes ----------------------------------------------------


@pytest.mark.parametrize("mode,shuffle", [("thread", True), ("process", False)])
def test_exactly_once_and_paired(unicode_dir, no_leaks, mode, shuffle):
    n = 500
    src = paired(write_paired(unicode_dir / "ünï.csv", n))
    with Loader(src, 32, shuffle=shuffle, seed=3, workers=2, mode=mode, with_ids=True) as loader:
        batches = list(loader)
    for batch in batches:
        assert batch["x"].dtype == np.float32 and batch["y"].dtype == np.float64
        assert_paired(batch)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(n))
    assert os.path.exists(str(unicode_dir / "ünï.csv") + SUFFIX)


def test_pickle_carries_no_handle_and_close_releases_everything(tmp_path):
    path = write_paired(tmp_path / "p.csv", 2000)
    paired(path)  # builds the cache
    src = paired(path)  # maps it
    src[5]

    def open_paths():
        return {f.path for f in psutil.Process().open_files()}

    assert {path, path + SUFFIX} <= open_paths()
    blob = pickle.dumps(src)
    assert len(blob) < 4000  # the 16 KB index stays behind; workers map the cache file
    clone = pickle.loads(blob)
    assert clone._handles.open_count() == 0 and clone._index is None
    np.testing.assert_array_equal(clone[1999]["x"], [7996, 7997, 7998, 7999])
    assert clone.locate(1999) == src.locate(1999)
    src.close()
    clone.close()
    assert not {path, path + SUFFIX} & open_paths()
    assert src.fingerprint() == clone.fingerprint() != CsvSource(path, x=FEATURES).fingerprint()


def test_utf_8_sig_is_read_like_utf_8_with_its_byte_order_mark(tmp_path):
    path = tmp_path / "excel.csv"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:  # what Excel writes: a BOM first
        csv.writer(f).writerows([["é", "b"], ["1", "2"], ["3", "4"]])
    source = CsvSource(str(path), x=["é", "b"], encoding="utf-8-sig", cache_dir=tmp_path / "cache")
    assert source.columns == ["é", "b"] and [source[i]["x"].tolist() for i in range(2)] == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="ASCII-compatible"):
        CsvSource(str(path), x=["b"], encoding="utf-16")


# -- files as pandas writes them ----------------------------------------------------------------------
def test_reads_what_dataframe_to_csv_writes_as_read_csv_reads_it(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "a": [1.5, np.nan, 3.25, 4.0, np.nan],
            "n": [1, 2, None, 4, 5],
            "label": ["cat", 'dog, "big"', "cat", None, "multi\nline"],
            "i": [1, 2, 3, 4, 5],
        }
    )
    path = tmp_path / "frame.csv"
    frame.to_csv(path)  # with its index column, NaN as "", quotes where needed
    theirs = pd.read_csv(path)
    src = CsvSource(str(path), x=["a", "n"], y="label", i="i", dtypes={"y": "class", "i": "int64"}, fill={"y": -1})
    assert src.classes == ["cat", 'dog, "big"', "multi\nline"] and src.class_to_label["cat"] == 0
    assert len(src) == len(theirs) == 5
    for k in range(5):
        np.testing.assert_array_equal(src[k]["x"], theirs[["a", "n"]].to_numpy(np.float32)[k])  # NaN where pandas
        label = theirs["label"][k]
        assert int(src[k]["y"]) == (-1 if pd.isna(label) else src.classes.index(label))
    with pytest.raises(
        DataError,
        match=r"frame.csv:4: column 'n': missing value '': int64 has no NaN; "
        r"pass fill=\{'n': value\}",
    ):
        CsvSource(str(path), n="n", dtypes={"n": "int64"})[2]
    assert int(CsvSource(str(path), n="n", dtypes={"n": "int64"})[1]["n"]) == 2  # "2.0", as pandas wrote it
    with pytest.raises(DataError, match="column 'label': missing value '': class names has no NaN"):
        CsvSource(str(path), y="label", dtypes={"y": "class"})[3]


@pytest.mark.parametrize("token", sorted(csv_rows.NA_VALUES))
def test_pandas_default_missing_values_are_nan(tmp_path, token):
    pd = pytest.importorskip("pandas")
    path = write(tmp_path / "na.csv", f"a,b\n{token},1\n2,{token}\n")
    assert pd.read_csv(path, keep_default_na=True)["a"].isna().tolist() == [True, False]  # pandas agrees
    src = CsvSource(path, v=["a", "b"])
    assert np.isnan(src[0]["v"][0]) and src[0]["v"][1] == 1 and np.isnan(src[1]["v"][1])
    assert CsvSource(path, v=["a", "b"], fill={"v": 0})[1]["v"].tolist() == [2, 0]


@pytest.mark.parametrize("sep,flag", [(";", ";"), ("\t", "\\t")])
def test_other_delimiters_and_utf_8_sig_from_pandas_and_the_cli(tmp_path, sep, flag, capsys):
    pd = pytest.importorskip("pandas")
    from steadyfeed.tools.cli import main

    path = tmp_path / "semi.csv"
    pd.DataFrame({"é": [0.5, 1.5], "y": ["b", "a"]}).to_csv(path, sep=sep, index=False, encoding="utf-8-sig")
    src = CsvSource(str(path), x=["é"], y="y", dtypes={"y": "class"}, delimiter=sep, encoding="utf-8-sig")
    assert src.classes == ["a", "b"] and [int(src[k]["y"]) for k in range(2)] == [1, 0]
    code = main(
        ["inspect", "--csv", str(path), "--x", "é", "--y", "y", "--dtype", "y=class", "--delimiter", flag, "--json"]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["count"] == 2


def test_class_keys_are_exactly_once_and_identical_across_workers(tmp_path, no_leaks):
    pd = pytest.importorskip("pandas")
    names = ["zebra", "ant", "moth, small", "ant"]
    path = tmp_path / "labels.csv"
    pd.DataFrame({"x": np.arange(40.0), "y": [names[i % 4] for i in range(40)]}).to_csv(path, index=False)
    digests = []
    for workers, mode in ((0, "thread"), (2, "thread"), (2, "process")):
        with Loader(
            CsvSource(str(path), x="x", y="y", dtypes={"y": "class"}),
            6,
            shuffle=True,
            seed=1,
            workers=workers,
            mode=mode,
            with_ids=True,
        ) as loader:
            batches = list(loader)
        for b in batches:
            expected = [sorted(set(names)).index(names[i % 4]) for i in b["id"].tolist()]
            assert b["y"].tolist() == expected and (b["x"] == b["id"]).all()
        digests.append(epoch_digest(batches))
    assert len(set(digests)) == 1
