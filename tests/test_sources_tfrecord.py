"""TFRecordSource: framing, CRCs, the offset index, Example decoding, concurrency, bad input, tf interop."""

import glob
import os
import pickle
import struct
import sys
import tracemalloc

import numpy as np
import psutil
import pytest
from helpers import assert_paired, epoch_digest, errors_in_threads, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import DataError, Loader, SampleError
from steadyfeed.packing import pack
from steadyfeed.sources.tfrecord import (
    FeatureSpec,
    RecordWriter,
    TFRecordSource,
    example_classes,
    masked_crc,
    read_record,
    scan,
)
from steadyfeed.sources.tfrecord import framing as tfrecord  # scan, frame, save_index, _crc32c: patched where used

pytestmark = pytest.mark.timeout(300)  # the TF-written fixture imports TensorFlow (minutes on a loaded machine)

N = 300
MODES = [(2, "thread"), (2, "process")]


# -- helpers ----------------------------------------------------------------------------------------
def example(**features) -> bytes:
    """A serialized Example from ``key=(kind, values)``, kind one of bytes_list/float_list/int64_list."""
    ex = example_classes()["Example"]()
    for key, (kind, values) in features.items():
        getattr(ex.features.feature[key], kind).value.extend(values)
    return ex.SerializeToString()


def write_file(path, records) -> str:
    writer = RecordWriter(path)
    for record in records:
        writer.write(record)
    writer.close()
    return str(path)


def foreign_record(i: int) -> bytes:
    """A record as TensorFlow code writes it: native lists, plus one raw-bytes array."""
    return example(
        x=("float_list", [i + k / 8 for k in range(6)]),
        y=("int64_list", [i * 10]),
        jpeg=("bytes_list", [b"\xff\xd8" + bytes([i % 256]) * (i % 5)]),
        z=("bytes_list", [np.arange(4, dtype=np.uint16).tobytes()]),
    )


FOREIGN = {"x": ("float32", (2, 3)), "y": ("int64", ()), "jpeg": "bytes", "z": ("uint16", (4,))}


@pytest.fixture
def foreign(tmp_path):
    """Two TFRecord files of 10 and 5 records, written in reverse name order."""
    write_file(tmp_path / "b.tfrecord", [foreign_record(i) for i in range(10, 15)])
    write_file(tmp_path / "a.tfrecord", [foreign_record(i) for i in range(10)])
    return tmp_path


@pytest.fixture
def packed(tmp_path):
    return pack(paired_source(N), tmp_path / "packed", shard_size=64, progress=False)


def flip_byte(path: str, at: int, keep_mtime: bool = False) -> None:
    """Flip one byte; with keep_mtime the cached index still looks valid (as after bit rot)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected 0x82F63B78): independent of google-crc32c."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def record_offset(source: TFRecordSource, i: int) -> tuple[str, int, int]:
    """(file, offset, data length) of sample i, from the source's own locate()."""
    path, rest = source.locate(i).split(" record ")
    number = int(rest.split()[0])
    rows = scan(path)
    return path, int(rows[number, 0]), int(rows[number, 1])


# -- framing ----------------------------------------------------------------------------------------
def test_masked_crc_matches_the_tfrecord_definition():
    assert crc32c_reference(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    for data in (b"", b"\x00" * 8, b"123456789", bytes(range(256)) * 3):
        crc = crc32c_reference(data)
        assert masked_crc(data) == ((((crc >> 15) | (crc << 17)) % 2**32) + 0xA282EAD8) % 2**32


def test_framing_layout_scan_and_read(tmp_path):
    records = [b"", b"a", os.urandom(1000), b"last"]
    path = write_file(tmp_path / "r.tfrecord", records)
    raw = open(path, "rb").read()
    assert raw[:8] == struct.pack("<Q", 0) and raw[8:12] == struct.pack("<I", masked_crc(raw[:8]))
    rows = scan(path)
    assert rows.tolist() == [[0, 0], [16, 1], [33, 1000], [1049, 4]] and len(raw) == 1049 + 16 + 4
    fd = os.open(path, os.O_RDONLY)
    try:
        assert [read_record(fd, path, n, int(o), int(ln)) for n, (o, ln) in enumerate(rows)] == records
    finally:
        os.close(fd)


# -- reading ----------------------------------------------------------------------------------------
def test_reads_native_lists_and_raw_bytes_from_sorted_files(foreign):
    for paths in (str(foreign / "*.tfrecord"), [foreign / "b.tfrecord", foreign / "a.tfrecord"]):
        src = TFRecordSource(paths, features=FOREIGN)
        assert len(src) == 15 and [os.path.basename(p) for p in src.paths] == ["a.tfrecord", "b.tfrecord"]
        s = src[12]
        assert s["x"].dtype == np.float32 and s["x"].shape == (2, 3)
        np.testing.assert_array_equal(s["x"].ravel(), [12 + k / 8 for k in range(6)])
        assert s["y"].dtype == np.int64 and s["y"].shape == () and s["y"] == 120
        assert s["jpeg"] == b"\xff\xd8" + bytes([12]) * 2
        assert s["z"].dtype == np.uint16 and s["z"].tolist() == [0, 1, 2, 3]
        assert src.locate(12) == f"{foreign / 'b.tfrecord'} record 2 at byte {scan(src.paths[1])[2, 0]}"
        src.close()


def test_read_many_keeps_the_order_of_ids(foreign):
    src = TFRecordSource(str(foreign / "*.tfrecord"), features={"y": "int64"})
    ids = [14, 0, 7, 7, 10, 3]
    assert [int(s["y"]) for s in src.read_many(ids)] == [10 * i for i in ids]
    src.close()


def test_read_bytes_gives_one_bytes_feature_in_the_order_of_ids(foreign):
    src = TFRecordSource(str(foreign / "*.tfrecord"), features=FOREIGN)
    ids = [14, 0, 7, 7, 10, 3]
    assert src.read_bytes(ids, "jpeg") == [src[i]["jpeg"] for i in ids]
    with pytest.raises(ValueError, match="'z' is not a bytes feature"):
        src.read_bytes(ids, "z")
    path, offset, length = record_offset(src, 7)
    flip_byte(path, offset + 12 + length // 2)
    with pytest.raises(DataError, match=rf"CRC mismatch in data of record 7 at byte {offset} of .*a.tfrecord"):
        TFRecordSource(str(foreign / "*.tfrecord"), features=FOREIGN).read_bytes([3, 7], "jpeg")
    src.close()


def test_read_bytes_answers_as_indexing_does_for_records_a_pack_never_holds(tmp_path):
    """Only a record holding exactly one bytes value is read straight; every other one (no
    such feature, an empty one, two values, another kind, not an Example, the damaged tail
    of a file) gets the default or the error that ``src[i]`` gives."""
    records = [
        example(jpeg=("bytes_list", [b"\xff\xd8one"])),
        example(other=("int64_list", [1])),  # no "jpeg"
        example(jpeg=("bytes_list", [])),  # an empty feature
        example(jpeg=("bytes_list", [b"a", b"b"])),  # two values
        example(jpeg=("int64_list", [7])),  # another kind
        b"\x0a\x03not protobuf",  # not an Example
        example(jpeg=("bytes_list", [b""])),  # one empty value: still one value
    ]
    path = write_file(tmp_path / "messy.tfrecord", records)
    with open(path, "ab") as f:
        f.write(b"\x07" * 5)  # a cut record: the file's damaged tail is one more sample
    defaults = {"jpeg": b"default"}
    for kwargs in ({}, {"defaults": defaults}):
        src = TFRecordSource(path, features={"jpeg": "bytes"}, **kwargs)
        assert len(src) == len(records) + 1
        for i in range(len(src)):
            try:
                expected = src[i]["jpeg"]
            except DataError as exc:
                with pytest.raises(DataError) as info:
                    src.read_bytes([0, i], "jpeg")
                assert str(info.value) == str(exc)
            else:
                assert src.read_bytes([i, 0], "jpeg") == [expected, b"\xff\xd8one"]
        assert src.read_bytes([6, 0], "jpeg") == [b"", b"\xff\xd8one"]
        with pytest.raises(IndexError, match="sample id 8 out of range"):
            src.read_bytes([0, 8], "jpeg")
        with pytest.raises(IndexError, match="sample id -1 out of range"):
            src.read_bytes([-1], "jpeg")
        src.close()
    # the default is for a record without the feature, not for one holding none or two values
    src = TFRecordSource(path, features={"jpeg": "bytes"}, defaults=defaults)
    assert src.read_bytes([1, 0], "jpeg") == [b"default", b"\xff\xd8one"]
    with pytest.raises(DataError, match="record 3 at byte .*found bytes_list with 2 value"):
        src.read_bytes([3], "jpeg")
    src.close()


def test_a_subset_of_keys_can_be_read_and_specs_are_parsed(foreign):
    src = TFRecordSource(str(foreign / "a.tfrecord"), features={"y": "int64"})
    assert list(src[3]) == ["y"]
    src.close()
    assert FeatureSpec.parse("k", ("float32", [2, 3])) == FeatureSpec("float32", (2, 3))
    assert FeatureSpec.parse("k", {"dtype": "<i8", "shape": []}) == FeatureSpec("int64", ())
    assert FeatureSpec.parse("k", (np.uint8, 5)) == FeatureSpec("uint8", (5,))
    assert FeatureSpec.parse("k", "str") == FeatureSpec("str")
    assert FeatureSpec.parse("k", ("int64", (-1,))) == FeatureSpec.parse("k", ("int64", (None,)))  # numpy's -1
    with pytest.raises(ValueError, match="feature 'k': cannot read spec"):
        FeatureSpec.parse("k", ("float32", (-2,)))
    with pytest.raises(ValueError, match="feature 'k': cannot read spec"):
        FeatureSpec.parse("k", ("no-such-dtype", ()))


# -- the offset index ------------------------------------------------------------------------------
def count_scans(monkeypatch) -> list:
    calls = []
    real = tfrecord.scan_records
    monkeypatch.setattr(tfrecord, "scan_records", lambda fd, name, size: calls.append(name) or real(fd, name, size))
    return calls


def test_index_is_cached_beside_the_file_and_rebuilt_when_the_file_changes(foreign, monkeypatch):
    calls = count_scans(monkeypatch)
    path = str(foreign / "a.tfrecord")
    TFRecordSource(path, features=FOREIGN)
    assert calls == [path] and os.path.exists(path + ".sfidx.npy")
    TFRecordSource(path, features=FOREIGN)
    assert calls == [path]  # reused
    with open(path, "ab") as f:  # size and mtime change
        header, footer = tfrecord.frame(foreign_record(99))
        f.write(header + foreign_record(99) + footer)
    src = TFRecordSource(path, features=FOREIGN)
    assert calls == [path, path] and len(src) == 11 and src[10]["y"] == 990


def test_index_goes_to_cache_dir_when_given(foreign, tmp_path, monkeypatch):
    calls = count_scans(monkeypatch)
    cache = tmp_path / "cache"
    TFRecordSource(str(foreign / "*.tfrecord"), features=FOREIGN, cache_dir=cache)
    TFRecordSource(str(foreign / "*.tfrecord"), features=FOREIGN, cache_dir=cache)
    assert len(calls) == 2 and len(os.listdir(cache)) == 2
    assert not glob.glob(str(foreign / "*.sfidx.npy"))


def test_a_damaged_or_lying_cached_index_is_rebuilt(foreign, monkeypatch):
    path = str(foreign / "a.tfrecord")
    TFRecordSource(path, features=FOREIGN)
    index = np.load(path + ".sfidx.npy")
    index[5, 0] += 1  # an offset that does not tile the file
    np.save(path + ".sfidx.npy", index)
    calls = count_scans(monkeypatch)
    assert TFRecordSource(path, features=FOREIGN)[3]["y"] == 30 and calls == [path]
    open(path + ".sfidx.npy", "wb").write(b"garbage")
    assert TFRecordSource(path, features=FOREIGN)[3]["y"] == 30 and calls == [path, path]


def test_an_unwritable_index_location_warns_and_still_reads(foreign, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(tfrecord, "save_index", refuse)
    with pytest.warns(UserWarning, match="could not cache the record index of .*a.tfrecord.*cache_dir="):
        src = TFRecordSource(str(foreign / "a.tfrecord"), features=FOREIGN)
    assert src[9]["y"] == 90


# -- concurrency and pickling -------------------------------------------------------------------------
@pytest.mark.parametrize("workers,mode", MODES)
def test_loader_delivers_each_record_once_and_paired(packed, workers, mode, no_leaks):
    with Loader(TFRecordSource(packed), 16, shuffle=True, seed=3, workers=workers, mode=mode, with_ids=True) as loader:
        batches = list(loader)
    for batch in batches:
        assert_paired(batch)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(N))
    with Loader(TFRecordSource(packed), 16, shuffle=True, seed=3, with_ids=True) as inline:
        assert epoch_digest(batches) == epoch_digest(inline)


def test_threads_share_one_source(packed):
    src = TFRecordSource(packed)

    def read(seed):
        for i in np.random.default_rng(seed).integers(0, N, 200):
            np.testing.assert_array_equal(src[int(i)]["x"], paired_source(N)[int(i)]["x"])

    errors = errors_in_threads(read, 8)
    src.close()
    assert errors == []


def test_pickles_without_handles_and_close_releases_them(packed):
    fds = psutil.Process().num_fds()
    src = TFRecordSource(packed)
    src[0], src[N - 1]  # opens two shards
    assert psutil.Process().num_fds() == fds + 2
    copy = pickle.loads(pickle.dumps(src))
    assert psutil.Process().num_fds() == fds + 2  # the copy opened nothing yet
    np.testing.assert_array_equal(copy[7]["x"], src[7]["x"])
    copy.close()
    src.close()
    assert psutil.Process().num_fds() == fds


def test_fingerprint_follows_the_files(foreign):
    path = str(foreign / "a.tfrecord")
    before = TFRecordSource(path, features=FOREIGN).fingerprint()
    assert TFRecordSource(path, features=FOREIGN).fingerprint() == before
    assert TFRecordSource(path, features={"y": "int64"}).fingerprint() != before
    os.utime(path, ns=(0, 10**9))  # a rewrite in place shows as a new mtime
    assert TFRecordSource(path, features=FOREIGN).fingerprint() != before


# -- bad input -------------------------------------------------------------------------------------
def test_flipped_data_byte_names_file_record_and_byte(packed):
    src = TFRecordSource(packed)
    path, offset, length = record_offset(src, 70)
    flip_byte(path, offset + 12 + length // 2)
    src = TFRecordSource(packed)
    expected = rf"CRC mismatch in data of record 6 at byte {offset} of .*shard-00001-of-00005"
    with pytest.raises(DataError, match=expected):
        src[70]
    np.testing.assert_array_equal(src[69]["x"], paired_source(N)[69]["x"])  # neighbours unharmed
    src.close()


def test_corrupt_record_through_the_loader_raises_sample_error(packed, no_leaks):
    path, offset, length = record_offset(TFRecordSource(packed), 70)
    flip_byte(path, offset + 12 + length - 1)
    with Loader(TFRecordSource(packed), 16, workers=2, mode="thread") as loader:
        with pytest.raises(SampleError, match="CRC mismatch in data of record 6") as info:
            list(loader)
    assert info.value.sample_id == 70 and "shard-00001-of-00005.tfrecord record 6" in info.value.location


@pytest.mark.parametrize("workers,mode", MODES)
def test_corrupt_records_are_quarantined_under_skip(packed, workers, mode, no_leaks):
    src = TFRecordSource(packed)
    for i in (5, 200):
        path, offset, length = record_offset(src, i)
        flip_byte(path, offset + 20)
    with Loader(
        TFRecordSource(packed), 16, shuffle=True, workers=workers, mode=mode, with_ids=True, on_error="skip"
    ) as loader:
        batches = list(loader)
        report = loader.quarantine_report()
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == sorted(set(range(N)) - {5, 200})
    assert sorted(entry["sample_id"] for entry in report) == [5, 200]
    assert all("CRC mismatch in data" in entry["message"] for entry in report)


def test_corrupt_length_crc_is_caught_on_read_and_when_indexing(packed):
    src = TFRecordSource(packed)
    path, offset, _ = record_offset(src, 130)
    flip_byte(path, offset + 9, keep_mtime=True)  # bit rot: the cached index still looks valid
    with pytest.raises(DataError, match=rf"CRC mismatch in the length of record 2 at byte {offset} of .*shard-00002"):
        TFRecordSource(packed)[130]
    os.unlink(path + ".sfidx.npy")
    with pytest.raises(DataError, match=rf"CRC mismatch in the length of record 2 at byte {offset} of .*shard-00002"):
        TFRecordSource(packed)
    src.close()


def test_a_truncated_file_reads_its_good_records_then_names_the_cut(foreign):
    path = str(foreign / "a.tfrecord")
    rows = scan(path)
    os.truncate(path, int(rows[9, 0]) + 20)
    src = TFRecordSource(path, features=FOREIGN)
    assert len(src) == 10 and [int(src[i]["y"]) for i in range(9)] == [i * 10 for i in range(9)]
    assert src.locate(9) == f"{path} record 9 at byte {rows[9, 0]}"
    with pytest.raises(
        DataError,
        match=rf"a.tfrecord is truncated or damaged: record 9 at byte {rows[9, 0]} "
        rf"declares {rows[9, 1]} data bytes but only 4 remain; the 9 record\(s\) "
        rf"before it read",
    ):
        src[9]
    os.truncate(path, int(rows[9, 0]) + 5)
    with pytest.raises(DataError, match="ends inside the header of record 9"):
        TFRecordSource(path, features=FOREIGN)[9]
    with pytest.raises(DataError, match="ends inside the header of record 9"):
        scan(path)  # the strict scan still refuses the file


def test_truncated_after_indexing_is_reported_on_read(foreign):
    path = str(foreign / "a.tfrecord")
    src = TFRecordSource(path, features=FOREIGN)
    os.truncate(path, int(scan(path)[9, 0]) + 20)
    with pytest.raises(DataError, match="record 9 at byte .* is truncated"):
        src[9]
    src.close()


def test_hostile_length_allocates_nothing(tmp_path):
    path = tmp_path / "hostile.tfrecord"
    length = struct.pack("<Q", 2**62)
    path.write_bytes(length + struct.pack("<I", masked_crc(length)) + b"tiny")
    tracemalloc.start()
    try:
        expected = f"hostile.tfrecord is truncated or damaged: record 0 at byte 0 declares {2**62} data bytes"
        with pytest.raises(DataError, match=expected):
            TFRecordSource(str(path), features={"x": "bytes"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_missing_feature_names_file_record_and_key(foreign):
    src = TFRecordSource(str(foreign / "*.tfrecord"), features={**FOREIGN, "label": ("int64", ())})
    with pytest.raises(
        DataError,
        match=r"record 1 at byte \d+ of .*b.tfrecord: feature 'label' is missing "
        r"\(the record has \['jpeg', 'x', 'y', 'z'\]\)",
    ):
        src[11]
    src.close()


@pytest.mark.parametrize(
    "key,spec,expected,found",
    [
        ("x", ("float32", (2, 2)), "expected float32 (2, 2)", "found float_list with 6 value(s)"),
        ("x", ("float32", ()), "expected float32 ()", "found float_list with 6 value(s); declare ('float32', (None,))"),
        ("x", ("float64", (4,)), "expected float64 (4,)", "found float_list with 6 value(s)"),
        ("y", ("bool", ()), "value 40 (at index 0) does not fit bool (0..1)", "declare a wider dtype"),
        (
            "z",
            ("uint16", (5,)),
            "expected uint16 (5,): one bytes_list value of 10 raw bytes",
            "found a bytes_list value of 8 bytes",
        ),
    ],
)
def test_wrong_dtype_or_shape_says_expected_and_found(foreign, key, spec, expected, found):
    src = TFRecordSource(str(foreign / "a.tfrecord"), features={key: spec})
    with pytest.raises(DataError) as info:
        src[4]
    message = str(info.value)
    assert message.startswith("record 4 at byte ") and f"a.tfrecord: feature {key!r}: {expected}" in message
    assert found in message
    src.close()


def test_not_an_example_is_a_clear_error(tmp_path):
    path = write_file(tmp_path / "junk.tfrecord", [b"\xff\xff\xff not protobuf"])
    with pytest.raises(DataError, match=r"record 0 at byte 0 of .*junk.tfrecord: not a valid tf.train.Example"):
        TFRecordSource(path, features={"x": "bytes"})[0]


def test_missing_files_empty_globs_and_missing_features(tmp_path, foreign):
    with pytest.raises(FileNotFoundError, match="nope.tfrecord"):
        TFRecordSource(str(tmp_path / "nope.tfrecord"), features=FOREIGN)
    with pytest.raises(FileNotFoundError, match="gone.tfrecord"):
        TFRecordSource([foreign / "a.tfrecord", tmp_path / "gone.tfrecord"], features=FOREIGN)
    with pytest.raises(DataError, match=r"no files match '.*\*.rec': expected TFRecord files"):
        TFRecordSource(str(tmp_path / "*.rec"), features=FOREIGN)
    with pytest.raises(DataError, match="empty list of files"):
        TFRecordSource([], features=FOREIGN)
    with pytest.raises(DataError, match="has no manifest.json"):
        TFRecordSource(str(foreign))
    not_tfrecord = tmp_path / "image.jpg"
    not_tfrecord.write_bytes(b"\xff\xd8\xff\xe0" + bytes(100))
    with pytest.raises(DataError, match="CRC mismatch in the length of record 0 at byte 0 of .*image.jpg: not a TFRec"):
        TFRecordSource(str(not_tfrecord), features=FOREIGN)


def test_a_missing_optional_dependency_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # makes its import fail
    monkeypatch.setattr(tfrecord, "_crc32c", tfrecord._crc32c.__wrapped__)  # not the cached one
    with pytest.raises(ImportError, match=r"needs the google-crc32c package: pip install 'steadyfeed\[tfrecord\]'"):
        TFRecordSource("anything.tfrecord", features={"x": "bytes"})


# -- TensorFlow interop (skipped without tensorflow) ----------------------------------------------
def test_tf_data_reads_packed_shards(packed):
    tf = pytest.importorskip(
        "tensorflow", reason="tensorflow is not installed (pip install 'steadyfeed[tf]')", exc_type=ImportError
    )
    import json

    manifest = json.loads((packed / "manifest.json").read_text())
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in manifest["features"]}
    files = sorted(glob.glob(str(packed / "shard-*.tfrecord")))
    src = TFRecordSource(packed)
    count = 0
    for i, record in enumerate(tf.data.TFRecordDataset(files)):
        parsed = tf.io.parse_single_example(record, spec)
        for key, f in manifest["features"].items():
            value = tf.reshape(tf.io.decode_raw(parsed[key], f["dtype"]), f["shape"]).numpy()
            assert value.dtype == src[i][key].dtype and value.tobytes() == src[i][key].tobytes()
        count += 1
    assert count == N
    src.close()


def test_reads_files_written_by_tensorflow(tmp_path):
    tf = pytest.importorskip(
        "tensorflow", reason="tensorflow is not installed (pip install 'steadyfeed[tf]')", exc_type=ImportError
    )
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(5):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5])),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                        "s": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"n{i}".encode()])),
                    }
                )
            )
            writer.write(ex.SerializeToString())
    src = TFRecordSource(path, features={"x": ("float32", (2,)), "y": ("int64", ()), "s": "str"})
    assert [(s["x"].tolist(), int(s["y"]), s["s"]) for s in (src[i] for i in range(5))] == [
        ([i, i + 0.5], i, f"n{i}") for i in range(5)
    ]
    src.close()


# -- files TensorFlow writes: every compression, ImageNet-style Examples, a cut tail ------------------
TF_RECORDS = 24
COMPRESSIONS = ["", "GZIP", "ZLIB"]


def png_bytes(i: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((6, 8, 3), i, np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tf_written(tmp_path_factory):
    """One file per compression, written once by tf.io.TFRecordWriter (importing TensorFlow costs
    seconds): ImageNet-style features, a variable-length list, a feature missing from odd records."""
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    pytest.importorskip("PIL")
    root = tmp_path_factory.mktemp("tf_written")
    for compression in COMPRESSIONS:
        options = tf.io.TFRecordOptions(compression_type=compression)
        with tf.io.TFRecordWriter(str(root / f"train-{compression or 'NONE'}.tfrecord"), options) as writer:
            for i in range(TF_RECORDS):
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png_bytes(i)])),
                    "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 5])),
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 4)))),
                    "box": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 0.5, 1, 2])),
                }
                if i % 2 == 0:
                    feature["weight"] = tf.train.Feature(float_list=tf.train.FloatList(value=[i / 10]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return root


@pytest.fixture
def tf_copy(tf_written, tmp_path):
    """A private copy of the TF-written files (tests cut and index them)."""
    for path in tf_written.glob("*.tfrecord"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_read_bytes_reads_the_encoded_images_tensorflow_wrote(tf_written, compression):
    src = TFRecordSource(tf_written / f"train-{compression or 'NONE'}.tfrecord")
    ids = [TF_RECORDS - 1, 0, 3, 3]
    assert src.read_bytes(ids, "image/encoded") == [png_bytes(i) for i in ids]
    src.close()


def decode_to_xy(sample: dict, rng) -> dict:  # module level: process workers import it
    from steadyfeed import decode_image

    return {"x": decode_image(sample["image/encoded"]), "y": sample["image/class/label"], "tokens": sample["tokens"]}


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_reads_what_tensorflow_writes_with_every_compression_inferring_the_features(tf_copy, compression):
    path = str(tf_copy / f"train-{compression or 'NONE'}.tfrecord")
    src = TFRecordSource(path)
    assert src.compressions == [compression]
    assert src.specs == {
        "box": FeatureSpec("float32", (4,)),
        "image/class/label": FeatureSpec("int64", ()),
        "image/encoded": FeatureSpec("bytes"),
        "tokens": FeatureSpec("int64", (None,)),
        "weight": FeatureSpec("float32", ()),
    }
    assert TFRecordSource(path, compression=compression or "NONE").compressions == [compression]  # given
    for i in (0, 7, TF_RECORDS - 1):  # random access, in any order
        sample = TFRecordSource(path, features={k: v for k, v in src.specs.items() if k != "weight"})[i]
        assert sample["image/encoded"] == png_bytes(i) and int(sample["image/class/label"]) == i % 5
        assert sample["tokens"].tolist() == list(range(i % 4)) and sample["box"].tolist() == [i, 0.5, 1, 2]
    with pytest.raises(DataError, match=r"record 1 at byte \d+ of .*feature 'weight' is missing .*defaults="):
        src[1]
    with_default = TFRecordSource(path, defaults={"weight": -1.0})
    assert float(with_default[1]["weight"]) == -1 and float(with_default[2]["weight"]) == pytest.approx(0.2)
    if compression:
        assert os.path.exists(path + ".sfraw") and src.locate(3).endswith("of its decompressed stream")
    src.close()
    with_default.close()


def test_a_wrong_compression_is_named(tf_copy):
    with pytest.raises(DataError, match=r"it is GZIP-compressed .*compression='GZIP' or compression=None"):
        TFRecordSource(str(tf_copy / "train-GZIP.tfrecord"), compression="NONE")
    with pytest.raises(DataError, match=r"the ZLIB stream of .*train-GZIP.tfrecord is corrupt"):
        TFRecordSource(str(tf_copy / "train-GZIP.tfrecord"), compression="ZLIB")
    with pytest.raises(ValueError, match="compression must be"):
        TFRecordSource(str(tf_copy / "train-GZIP.tfrecord"), compression="bz2")


def test_the_decompressed_copy_is_made_once_and_again_when_the_file_changes(tf_copy, monkeypatch):
    path = str(tf_copy / "train-GZIP.tfrecord")
    made = []
    real = tfrecord.decompress
    monkeypatch.setattr(tfrecord, "decompress", lambda *a: made.append(a[0]) or real(*a))
    TFRecordSource(path).close()
    TFRecordSource(path).close()
    assert made == [path]
    os.utime(path, ns=(0, 10**9))  # rewritten in place
    TFRecordSource(path).close()
    assert made == [path, path]
    os.unlink(path + ".sfraw")  # the copy removed: made again, never read stale
    assert int(TFRecordSource(path, features={"image/class/label": "int64"})[5]["image/class/label"]) == 0
    assert len(made) == 3


@pytest.mark.parametrize("workers,mode", [(2, "thread"), (2, "process")])
def test_compressed_records_are_read_once_and_bit_identical_across_workers_and_modes(tf_copy, workers, mode, no_leaks):
    def run(w, m):
        src = TFRecordSource(str(tf_copy / "train-ZLIB.tfrecord"), defaults={"weight": 0.0})  # odd records lack it
        with Loader(
            src, 5, transform=decode_to_xy, collate="pad", shuffle=True, seed=4, workers=w, mode=m, with_ids=True
        ) as loader:
            return list(loader)

    batches = run(workers, mode)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(TF_RECORDS))
    for b in batches:
        assert (b["x"][:, 0, 0, 0] == b["id"]).all() and (b["y"] == b["id"] % 5).all()
        assert (b["tokens_shape"][:, 0] == b["id"] % 4).all()
    assert epoch_digest(batches) == epoch_digest(run(0, "thread"))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_cut_tail_reads_every_good_record_then_raises_or_is_quarantined(tf_copy, compression, no_leaks):
    path = tf_copy / f"train-{compression or 'NONE'}.tfrecord"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])  # inside the last record (and the stream's trailer)
    src = TFRecordSource(str(path), features={"image/class/label": "int64"})
    good = len(src) - 1
    assert TF_RECORDS - 3 <= good < TF_RECORDS  # what tf.data reads before its DataLossError
    assert [int(src[i]["image/class/label"]) for i in range(good)] == [i % 5 for i in range(good)]
    what = "ends before its end marker" if compression else "is truncated"
    with pytest.raises(DataError, match=rf"{what}.*; the {good} record\(s\) before it read"):
        src[good]
    src.close()
    with Loader(
        TFRecordSource(str(path), features={"image/class/label": "int64"}), 4, workers=2, mode="process", with_ids=True
    ) as loader:
        seen = []
        with pytest.raises(SampleError) as info:
            for batch in loader:
                seen += batch["id"].tolist()
    assert seen == list(range(good // 4 * 4)) and info.value.sample_id == good and str(path) in info.value.location
    with Loader(
        TFRecordSource(str(path), features={"image/class/label": "int64"}),
        4,
        workers=2,
        mode="thread",
        on_error="skip",
        with_ids=True,
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader]).tolist()
        report = loader.quarantine_report()
    assert ids == list(range(good)) and [(e["sample_id"], e["location"].split(" record ")[0]) for e in report] == [
        (good, str(path))
    ]


def test_int_casts_are_checked_and_name_the_record(tf_copy):
    src = TFRecordSource(
        str(tf_copy / "train-NONE.tfrecord"), features={"image/class/label": ("uint8", ()), "tokens": ("int8", (-1,))}
    )
    assert src[3]["image/class/label"].dtype == np.uint8 and src[3]["tokens"].tolist() == [0, 1, 2]
    narrow = TFRecordSource(str(tf_copy / "train-NONE.tfrecord"), features={"box": ("int8", (4,))})
    with pytest.raises(DataError, match="feature 'box': expected int8"):
        narrow[0]  # a float_list is never cast to an integer
    path = write_file(tf_copy / "big.tfrecord", [example(v=("int64_list", [1, 2**40]))])
    with pytest.raises(
        DataError,
        match=r"record 0 at byte 0 of .*big.tfrecord: feature 'v': value 1099511627776 "
        r"\(at index 1\) does not fit int32",
    ):
        TFRecordSource(path, features={"v": ("int32", (2,))})[0]


def test_decode_image_decodes_image_encoded_as_image_folder_decodes_the_file(tf_copy, tmp_path):
    from steadyfeed import decode_image
    from steadyfeed.sources.images import ImageReader

    src = TFRecordSource(str(tf_copy / "train-GZIP.tfrecord"), features={"image/encoded": "bytes"})
    (tmp_path / "img.png").write_bytes(src[9]["image/encoded"])
    for size, channels in ((None, 3), ((3, 4), 1)):
        np.testing.assert_array_equal(
            decode_image(src[9]["image/encoded"], size, channels),
            ImageReader(size, channels).load(tmp_path / "img.png"),
        )
    with pytest.raises(DataError, match="record 9: not a decodable image"):
        decode_image(src[9]["image/encoded"][:30], where="record 9")
    src.close()


# -- read_batch: a batch of records straight into one array per feature ----------------------------
def stacked(src, ids) -> dict:
    """What the per-sample path makes of ``ids``: each ``src[i]``, stacked."""
    samples = [src[int(i)] for i in ids]
    return {key: np.stack([np.asarray(s[key]) for s in samples]) for key in src.specs}


def assert_same_batch(batch: dict, expected: dict) -> None:
    assert batch.keys() == expected.keys()
    for key, want in expected.items():
        got = batch[key]
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape, key
        assert got.flags.writeable and got.flags.c_contiguous, key  # fresh arrays the caller keeps
        assert got.tobytes() == want.tobytes(), key  # bit for bit (NaN payloads included)


class PerSample:
    """A source read one sample at a time: its records, without its read_batch (the engine's fallback)."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return self.source[i]

    def locate(self, i):
        return self.source.locate(i)

    def close(self):
        self.source.close()


SIGNALING_NAN = np.array([0x7F800001], np.uint32).view(np.float32)[0]


def mixed_sample(i: int) -> dict:
    rng = np.random.default_rng(i)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    x[0, 0] = SIGNALING_NAN if i % 7 == 0 else x[0, 0]  # bit-exact, not only equal
    return {
        "x": x,
        "y": np.int64(i * 1000 - 7),
        "flags": rng.integers(0, 2, 5).astype(bool),
        "pixels": rng.integers(0, 256, (2, 2), dtype=np.uint8),
        "half": np.float16(i / 3),
        "pair": (rng.normal(size=2) + 1j).astype(np.complex64),
    }


MIXED = 150


@pytest.fixture(scope="module")
def mixed_pack(tmp_path_factory):
    """A pack of several dtypes and shapes, over three shards (read-only: tests share it)."""
    return pack((mixed_sample(i) for i in range(MIXED)), tmp_path_factory.mktemp("mixed") / "pack", 64, progress=False)


batch_ids = st.lists(st.integers(0, MIXED - 1), min_size=1, max_size=40)  # any order, repeats


@settings(max_examples=40, deadline=None)
@given(batch_ids, st.sampled_from([None, ("x", "pixels"), ("y",)]))
def test_read_batch_of_a_pack_is_the_samples_stacked_bit_for_bit(mixed_pack, ids, keys):
    features = None if keys is None else {k: v for k, v in TFRecordSource(mixed_pack).specs.items() if k in keys}
    src = TFRecordSource(mixed_pack, features=features)
    assert_same_batch(src.read_batch(ids), stacked(src, ids))
    assert src._layout is not None  # a pack's records are read through their layout, not parsed
    assert_same_batch(src.read_batch(ids[::-1]), stacked(src, ids[::-1]))  # the layout learnt, reused
    assert_same_batch(src.read_batch(np.array(ids)), stacked(src, ids))
    src.close()


@pytest.fixture(scope="module")
def tf_fixed(tmp_path_factory):
    """Two files written by tf.io.TFRecordWriter: native lists (float and int64), a raw-bytes
    array, and a bytes feature of variable length that the specs below leave out."""
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    root = tmp_path_factory.mktemp("tf_fixed")
    for name, numbers in (("part-0.tfrecord", range(0, 17)), ("part-1.tfrecord", range(17, 30))):
        with tf.io.TFRecordWriter(str(root / name)) as writer:
            for i in numbers:
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i + k / 8 for k in range(6)])),
                    "w": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 3])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 10 - 50])),
                    "small": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 7, 255])),
                    "z": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[(np.arange(4, dtype="<u2") + i).tobytes()])
                    ),
                    "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"n" * (i % 3)])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return root


TF_FIXED = {"x": ("float32", (2, 3)), "w": "float64", "y": "int64", "small": ("uint8", (2,)), "z": ("uint16", (4,))}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 29), min_size=1, max_size=30), st.sampled_from([TF_FIXED, {"z": ("uint16", (4,))}]))
def test_read_batch_of_files_tensorflow_wrote_is_the_samples_stacked(tf_fixed, ids, features):
    src = TFRecordSource(str(tf_fixed / "*.tfrecord"), features=features)
    assert_same_batch(src.read_batch(ids), stacked(src, ids))
    if "x" in features:
        assert src._layout is None  # native lists: every record parsed, then put in its row
    # z alone: a layout is learnt, but each record's other features differ, so each is parsed
    assert_same_batch(src.read_batch(sorted(ids)), stacked(src, sorted(ids)))
    src.close()


def test_read_batch_infers_the_same_arrays_from_what_tensorflow_wrote(tf_fixed):
    src = TFRecordSource(str(tf_fixed / "*.tfrecord"))  # inferred: name and z are bytes, so no stacked batch
    assert src.read_batch is None
    numbers = {k: v for k, v in src.specs.items() if v.dtype != "bytes"}
    assert sorted(numbers) == ["small", "w", "x", "y"]
    src = TFRecordSource(str(tf_fixed / "*.tfrecord"), features=numbers)
    batch = src.read_batch([29, 0, 16, 17])
    assert batch["y"].tolist() == [240, -50, 110, 120] and batch["x"].dtype == np.float32
    assert batch["x"][:, 5].tolist() == [29.625, 0.625, 16.625, 17.625] and batch["small"].shape == (4, 2)
    assert_same_batch(batch, stacked(src, [29, 0, 16, 17]))


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (lengths below 128 here: one-byte varints)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def raw_example(*entries: tuple[str, bytes]) -> bytes:
    """An Example written by hand, map entries in the order given (one bytes_list value each)."""
    feature_map = b"".join(
        field(1, field(1, key.encode()) + field(2, field(1, field(1, value)))) for key, value in entries
    )
    return field(1, feature_map)


def test_records_that_differ_from_the_first_in_more_than_values_are_parsed_or_raise(tmp_path):
    """Same lengths, other places: a copy at the first record's offsets would swap or shift the values."""
    x, y = np.float64(1.5).tobytes(), np.int64(-3).tobytes()
    records = [
        raw_example(("x", x), ("y", y)),
        raw_example(("y", y), ("x", x)),  # the keys in the other order: x's bytes where y's were
        raw_example(("x", x[:4]), ("y", y + x[:4])),  # as long, the values shifted: must raise
        raw_example(("x", np.float64(2.5).tobytes()), ("y", np.int64(7).tobytes())),  # the layout's own
        raw_example(("q", x), ("y", y)),  # another key of the same length: x is missing
    ]
    assert len({len(r) for r in records}) == 1
    src = TFRecordSource(write_file(tmp_path / "h.tfrecord", records), features={"x": "float64", "y": "int64"})
    assert_same_batch(src.read_batch([0, 1, 3]), stacked(src, [0, 1, 3]))
    assert src.read_batch([3, 1])["x"].tolist() == [2.5, 1.5] and src._layout is not None
    for bad, found in ((2, "found a bytes_list value of 4 bytes"), (4, "feature 'x' is missing")):
        offset = bad * (len(records[0]) + 16)
        with pytest.raises(DataError, match=rf"record {bad} at byte {offset} of .*h.tfrecord: .*{found}"):
            src.read_batch([0, bad, 3])
    with Loader(src, 5, workers=0) as loader:
        with pytest.raises(SampleError, match="record 2 at .*found a bytes_list value of 4 bytes") as info:
            list(loader)
    assert info.value.sample_id == 2  # the first bad one: the fallback pins it


@pytest.mark.parametrize(
    "features,defaults,collate",
    [
        ({"x": ("float32", (None,)), "y": "int64"}, None, "pad"),  # a list of any length
        ({"x": ("float32", (-1, 3)), "y": "int64"}, None, "pad"),
        ({"x": ("float32", (2, 3)), "jpeg": "bytes"}, None, "pad"),
        ({"y": "int64", "text": "str"}, None, "stack"),
        ({"x": ("float32", (2, 3)), "y": "int64"}, {"y": -1}, "stack"),  # a default to put in
    ],
)
def test_no_read_batch_without_fixed_number_arrays_and_the_loader_still_reads(tmp_path, features, defaults, collate):
    records = [
        example(
            x=("float_list", [i + k / 8 for k in range(6)]),
            y=("int64_list", [i * 10]),
            jpeg=("bytes_list", [b"\xff\xd8" + bytes([i]) * (i % 5)]),
            text=("bytes_list", [f"s{i % 10}".encode()]),
        )
        for i in range(15)
    ]
    src = TFRecordSource(write_file(tmp_path / "v.tfrecord", records), features=features, defaults=defaults)
    assert src.read_batch is None and pickle.loads(pickle.dumps(src)).read_batch is None
    with Loader(src, 4, collate=collate, with_ids=True) as loader:
        batches = list(loader)
    assert np.concatenate([b["id"] for b in batches]).tolist() == list(range(15))
    for b in batches:
        if "y" in b:
            assert (b["y"] == b["id"] * 10).all()
        if "x" in b:
            assert (b["x"].reshape(len(b["id"]), -1)[:, 0] == b["id"]).all()


def test_a_fixed_source_pickles_with_its_read_batch_and_layout(mixed_pack):
    src = TFRecordSource(mixed_pack)
    before = src.read_batch([3, 1])
    copy = pickle.loads(pickle.dumps(src))
    assert copy._layout is not None and copy._layout.gaps == src._layout.gaps
    assert_same_batch(copy.read_batch([3, 1]), before)
    assert_same_batch(before, stacked(src, [3, 1]))


@pytest.mark.parametrize("where", ["payload", "last byte"])
def test_a_corrupt_record_fails_the_batched_read_and_the_loader_names_it_as_before(packed, where, no_leaks):
    path, offset, length = record_offset(TFRecordSource(packed), 70)
    flip_byte(path, offset + 12 + (length // 2 if where == "payload" else length - 1))
    src = TFRecordSource(packed)
    with pytest.raises(DataError, match=rf"CRC mismatch in data of record 6 at byte {offset} of .*shard-00001"):
        src.read_batch(range(64, 80))
    assert_same_batch(src.read_batch(range(71, 90)), stacked(src, range(71, 90)))  # other records unharmed
    src.close()

    def failure(source):
        with Loader(source, 16, shuffle=True, seed=3, workers=0) as loader:
            with pytest.raises(SampleError) as info:
                list(loader)
        return info.value

    fast, per_sample = failure(TFRecordSource(packed)), failure(PerSample(TFRecordSource(packed)))
    message = lambda error: str(error).split("\n--- worker traceback")[0]  # noqa: E731 - the traceback has one more frame
    assert (fast.sample_id, fast.location, message(fast)) == (
        per_sample.sample_id,
        per_sample.location,
        message(per_sample),
    )
    assert fast.sample_id == 70 and "CRC mismatch in data of record 6" in str(fast)


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread")])
def test_a_loader_epoch_over_a_pack_takes_the_fast_path_bit_identically(mixed_pack, monkeypatch, workers, mode):
    kw = dict(shuffle=True, seed=5, with_ids=True, workers=workers, mode=mode)
    with Loader(PerSample(TFRecordSource(mixed_pack)), 16, **kw) as loader:
        reference = [epoch_digest(loader.epoch(e)) for e in range(2)]
    batched = []
    real = TFRecordSource.read_batch
    monkeypatch.setattr(TFRecordSource, "read_batch", lambda self, ids: batched.append(len(ids)) or real(self, ids))
    for name in ("__getitem__", "read_many"):  # the per-sample path: never taken
        monkeypatch.setattr(TFRecordSource, name, lambda *a: pytest.fail("a sample was read one by one"))
    with Loader(TFRecordSource(mixed_pack), 16, **kw) as loader:
        digests = [epoch_digest(loader.epoch(e)) for e in range(2)]
    assert digests == reference and sum(batched) == 2 * MIXED


def test_a_layout_is_kept_only_when_protobuf_proves_it(mixed_pack):
    from steadyfeed.sources.tfrecord.example import RecordLayout

    src = TFRecordSource(mixed_pack)
    data = src._data(0, 3)
    layout = RecordLayout.learn(data, src.specs)
    assert layout is not None and layout.matches(data) and not layout.matches(data[:-1])
    assert layout.payloads["x"][1] - layout.payloads["x"][0] == 48
    for shift in (-1, 1):  # the walk's places off by one byte: protobuf decodes other bytes there
        moved = {key: (start + shift, end + shift) for key, (start, end) in layout.payloads.items()}
        assert not RecordLayout(data, moved)._proven(src.specs, data)
    assert RecordLayout(data, layout.payloads)._proven(src.specs, data)
    assert RecordLayout.learn(data, {**src.specs, "x": FeatureSpec("float32", (None,))}) is None  # no fixed size
    src.close()
