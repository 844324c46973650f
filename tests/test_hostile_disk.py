"""Full and read-only disks: pack, DiskCache, the index caches and the quarantine file.

Each test runs a child interpreter in a mount namespace of its own where a directory of the
test is a small tmpfs (1 MiB) that fills up mid-write, or a read-only bind mount. What must
hold: a clear error (or, where the loader goes on, one warning) naming the path and the bytes
needed; no partial or corrupt file left where a later run would trust it; every training
sample still delivered.
"""

import json

import pytest
from helpers import paired_source
from hostile import run_python

pytestmark = pytest.mark.timeout(240)

PREAMBLE = """
    import glob, json, os, warnings
    import numpy as np
    import steadyfeed as sf
    from helpers import assert_paired, paired_source

    def fill(directory, leave=0):
        '''Another program fills the filesystem of ``directory``, to its last page but ``leave`` bytes.'''
        fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            for chunk in (1 << 16, 4096):
                try:
                    while True:
                        os.write(fd, bytes(chunk))
                except OSError:
                    pass
            os.ftruncate(fd, os.fstat(fd).st_size - leave)
        finally:
            os.close(fd)

    def epoch_ids(loader):
        ids = []
        for batch in loader.epoch(0):
            assert_paired(batch)
            ids += batch["id"].tolist()
        return sorted(ids)

    def files_under(directory):
        return sorted(os.path.relpath(p, directory) for p in glob.glob(os.path.join(directory, "**"), recursive=True)
                      if os.path.isfile(p))

    def caught_warnings(fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
        return result, [str(w.message) for w in caught]
"""


def child(body: str, **mounts) -> dict:
    return run_python(PREAMBLE + "\n    if __name__ == '__main__':\n" + body, **mounts)


WIDE = 8192  # 64 KiB samples: 64 of them are 4 MiB, four times the small filesystem


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small"
    path.mkdir()
    return str(path)


def test_pack_on_a_filesystem_that_fills_up_names_out_dir_and_the_bytes_and_leaves_nothing(small, tmp_path):
    import steadyfeed as sf

    whole = sf.pack(paired_source(64, WIDE), tmp_path / "reference", shard_size=16, progress=False)
    size = sum(p.stat().st_size for p in whole.iterdir())
    out = child(
        f"""
        try:
            sf.pack(paired_source(64, {WIDE}), os.path.join({small!r}, "packed"), shard_size=16, progress=False)
            out = {{"error": None}}
        except sf.DiskFull as exc:
            out = {{"error": str(exc), "needed": exc.needed, "free": exc.free, "path": exc.path,
                   "is_oserror": isinstance(exc, OSError) and exc.errno == 28}}
        out["left"] = files_under({small!r}) + os.listdir({small!r})
        print(json.dumps(out))
    """,
        small_fs=(small, "1m"),
    )
    assert out["error"] is not None, "the pack fit: the test is not testing a full disk"
    assert out["path"].endswith("small/packed") and "packed for the pack" in out["error"]
    assert 0.8 * size <= out["needed"] <= 1.5 * size, (out["needed"], size)  # an estimate, close to the truth
    assert out["free"] < out["needed"] and out["is_oserror"]
    assert out["left"] == []  # no dataset, no staging directory, no shard


def test_disk_cache_on_a_full_disk_serves_every_sample_and_leaves_only_whole_files(small):
    out = child(
        f"""
        def run():
            cache = sf.DiskCache(paired_source(64, {WIDE}), os.path.join({small!r}, "cache"), key="v1")
            with sf.Loader(cache, 8, shuffle=True, workers=2, with_ids=True) as loader:
                return epoch_ids(loader), cache.stats()

        (ids, stats), said = caught_warnings(run)
        # a later run trusts what is on disk: every file there must be whole and right
        again = sf.DiskCache(paired_source(64, {WIDE}), os.path.join({small!r}, "cache"), key="v1")
        with sf.Loader(again, 8, with_ids=True) as loader:
            ids_again = epoch_ids(loader)
        print(json.dumps({{"once": ids == list(range(64)), "stats": stats, "warnings": said,
                          "again": ids_again == list(range(64)), "again_stats": again.stats(),
                          "files": files_under({small!r})}}))
    """,
        small_fs=(small, "1m"),
    )
    assert out["once"] and out["again"]  # training data never lost
    assert out["stats"]["write_errors"] > 0 and out["stats"]["misses"] == 64
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "no space left on the filesystem of" in out["warnings"][0] and "65," in out["warnings"][0]
    assert out["again_stats"]["corrupt"] == 0 and out["again_stats"]["hits"] > 0  # what was kept is whole
    assert not any(name.endswith(".tmp") for name in out["files"]), out["files"]


def test_index_caches_on_a_full_disk_warn_and_leave_no_partial_index(small, tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("x,y\n" + "".join(f"{i},{3 * i + 1}\n" for i in range(20_000)))
    out = child(
        f"""
        cache_dir = os.path.join({small!r}, "idx")
        os.makedirs(cache_dir)
        fill({small!r})
        def read():
            src = sf.CsvSource({str(data)!r}, x="x", y="y", cache_dir=cache_dir)
            return all(float(src[i]["y"]) == 3 * i + 1 for i in (0, 777, 19_999))
        rows_ok, said = caught_warnings(read)
        print(json.dumps({{"warnings": said, "rows_ok": rows_ok, "files": files_under({small!r})}}))
    """,
        small_fs=(small, "1m"),
    )
    assert out["rows_ok"]
    assert len(out["warnings"]) == 1 and "could not save the index" in out["warnings"][0]
    assert "no space left on the filesystem of" in out["warnings"][0] and "bytes" in out["warnings"][0]
    assert out["files"] == ["filler"]  # no index, no temporary file


def test_the_quarantine_file_never_ends_in_half_a_line_and_the_report_keeps_everything(small):
    out = child(
        f"""
        from helpers import FaultySource
        path = os.path.join({small!r}, "quarantine.jsonl")
        fill({small!r}, leave=4096)  # one page left: some lines fit, then one is cut where it fills
        bad = set(range(0, 400, 2))
        def run():
            src = FaultySource(400, fail=bad)
            with sf.Loader(src, 10, on_error="skip", max_error_fraction=0.6, quarantine=path,
                           with_ids=True) as loader:
                return epoch_ids(loader), loader.quarantine_report()
        (ids, report), said = caught_warnings(run)
        text = open(path).read()
        print(json.dumps({{"ids": ids == sorted(set(range(400)) - bad), "report": len(report), "warnings": said,
                          "text": text}}))
    """,
        small_fs=(small, "1m"),
    )
    assert out["ids"] and out["report"] == 200  # the others delivered; every skip in the report
    assert len(out["warnings"]) == 1 and "quarantine.jsonl cannot take entry" in out["warnings"][0]
    assert "no space left on the filesystem of" in out["warnings"][0]
    lines = out["text"].splitlines()
    assert 0 < len(lines) < 200 and out["text"].endswith("\n")  # a prefix, some lines in: cut where it filled
    assert [json.loads(line)["sample_id"] for line in lines] == list(range(0, 2 * len(lines), 2))


def test_read_only_cache_directories_fall_back_as_documented(tmp_path):
    """A DiskCache on a read-only directory serves what is cached there and reads the rest from
    the source (one warning); a cache that cannot even be made warns once when it is made."""
    import steadyfeed as sf

    cache_dir = tmp_path / "ro"
    half = sf.DiskCache(paired_source(64), cache_dir, key="v1")
    for i in range(0, 64, 2):
        half[i]  # an earlier run cached half the samples
    out = child(
        f"""
        def run(key):
            cache = sf.DiskCache(paired_source(64), {str(cache_dir)!r}, key=key)
            with sf.Loader(cache, 8, shuffle=True, workers=2, with_ids=True) as loader:
                return epoch_ids(loader) == list(range(64)), cache.stats()
        (ok, stats), said = caught_warnings(lambda: run("v1"))
        (ok_new, stats_new), said_new = caught_warnings(lambda: run("v2"))  # no such subdirectory yet
        print(json.dumps({{"ok": ok, "stats": stats, "warnings": said, "ok_new": ok_new, "stats_new": stats_new,
                          "warnings_new": said_new}}))
    """,
        read_only=str(cache_dir),
    )
    assert out["ok"] and out["ok_new"]
    assert out["stats"]["hits"] == 32 and out["stats"]["misses"] == 32 and out["stats"]["write_errors"] == 32
    assert len(out["warnings"]) == 1 and "Read-only file system" in out["warnings"][0]
    assert out["stats_new"]["hits"] == 0 and out["stats_new"]["write_errors"] == 64
    assert len(out["warnings_new"]) == 1 and "samples cached there already are served" in out["warnings_new"][0]


def test_tfrecord_index_and_decompressed_copy_on_a_full_disk(small, tmp_path):
    """The record index of a TFRecord file: one warning, every record still read. A GZIP file,
    read through a decompressed copy that cannot be written: a DataError naming the file and
    the fix. Neither leaves a file behind."""
    import gzip

    import steadyfeed as sf

    packed = sf.pack(paired_source(50), tmp_path / "packed", shard_size=50, progress=False)
    shard = str(next(p for p in packed.iterdir() if p.name.endswith(".tfrecord")))
    zipped = str(tmp_path / "zipped.tfrecord")
    with open(shard, "rb") as f, gzip.open(zipped, "wb") as out:
        out.write(f.read())
    out = child(
        f"""
        fill({small!r})
        def read():
            src = sf.TFRecordSource({shard!r}, cache_dir={small!r})  # features unnamed: raw bytes
            return len(src) == 50 and all(np.frombuffer(src[i]["x"], np.float64)[0] == 4 * i for i in range(50))
        ok, said = caught_warnings(read)
        try:
            sf.TFRecordSource({zipped!r}, cache_dir={small!r})
            zipped_error = None
        except sf.DataError as exc:
            zipped_error = str(exc)
        print(json.dumps({{"ok": ok, "warnings": said, "zipped": zipped_error, "files": files_under({small!r})}}))
    """,
        small_fs=(small, "1m"),
    )
    assert out["ok"]
    assert len(out["warnings"]) == 1 and "could not cache the record index" in out["warnings"][0]
    assert "no space left on the filesystem of" in out["warnings"][0]
    assert out["zipped"] and "zipped.tfrecord is GZIP-compressed" in out["zipped"]
    assert (
        "no space left on the filesystem of" in out["zipped"] and "with room for the uncompressed data" in out["zipped"]
    )
    assert out["files"] == ["filler"]
