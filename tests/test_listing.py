"""File listings: full-path order in one pass, compact, cached until a directory changes,
shared with process workers by file name, never trusted stale."""

import os
import pickle

import numpy as np
import pytest

from steadyfeed import DataError, Loader, NpyPairs
from steadyfeed.sources import listing as listing_module
from steadyfeed.sources.listing import cached_listing, list_tree

pytestmark = pytest.mark.timeout(120)


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()


TRICKY = [
    "b.png",
    "b-c/x",
    "b/y",
    "b/a/z",
    "b0",
    "a b/q",
    "é/ü",
    "B/1",
    "b/.hidden",
    ".top/x",
    "c/d/e/f/g",
    "b/y-1/z",
    "b/y.txt",
    "b/yy/w",
]


def test_the_order_is_that_of_sorting_full_paths(tmp_path):
    for name in TRICKY:
        touch(tmp_path / name)
    listing = list_tree(str(tmp_path))
    expected = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path)
        for d, dirs, files in os.walk(tmp_path)
        for f in files
        if not any(part.startswith(".") for part in os.path.relpath(os.path.join(d, f), tmp_path).split(os.sep))
    )
    assert [listing.relative(i) for i in range(len(listing))] == expected


@pytest.mark.parametrize("root_suffix", ["", os.sep])
def test_a_batch_of_paths_equals_the_paths_one_by_one(tmp_path, root_suffix):
    for name in TRICKY:
        touch(tmp_path / name)
    listing = list_tree(str(tmp_path) + root_suffix)
    ids = np.random.default_rng(0).integers(0, len(listing), 50)
    assert listing.paths(ids) == [listing.path(i) for i in ids.tolist()]
    assert listing.paths(np.arange(len(listing))) == [
        os.path.join(str(tmp_path), listing.relative(i)) for i in range(len(listing))
    ]
    assert all(os.path.isfile(p) for p in listing.paths(ids)) and listing.paths(np.array([], np.int64)) == []


def test_a_folder_linked_twice_is_listed_once(tmp_path):
    touch(tmp_path / "real" / "x")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    listing = list_tree(str(tmp_path))
    assert [listing.relative(i) for i in range(len(listing))] == ["alias/x"]  # the first in path order


def test_a_typical_tree_costs_under_100_bytes_a_file(tmp_path):
    for c in range(4):
        for k in range(500):
            touch(tmp_path / f"n0144076{c}" / f"n0144076{c}_{10000 + k}.JPEG")
    listing = list_tree(str(tmp_path), [f"n0144076{c}" for c in range(4)])
    assert len(listing) == 2000
    assert listing.nbytes() / len(listing) <= 100
    assert list(np.diff(listing.group_starts)) == [500] * 4


def npy_dirs(root, names):
    for sub in ("x", "y"):
        os.makedirs(root / sub, exist_ok=True)
        for name in names:
            np.save(root / sub / name, np.float32([len(name)]))
    return str(root / "x"), str(root / "y")


def test_the_cache_is_reused_until_a_directory_changes(tmp_path, monkeypatch):
    x, y = npy_dirs(tmp_path, ["a.npy", "b.npy"])
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy"]
    assert os.path.exists(x + ".npy-listing.sfidx.npy")
    real = listing_module.list_tree

    def refuse(*args, **kwargs):
        raise AssertionError("listed again although nothing changed")

    monkeypatch.setattr(listing_module, "list_tree", refuse)
    import steadyfeed.sources.npy as npy_module

    monkeypatch.setattr(npy_module, "list_tree", refuse)
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy"]  # from the cache
    np.save(os.path.join(x, "a.npy"), np.float32([7, 7]))  # content only: the names still hold
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy"]
    monkeypatch.setattr(npy_module, "list_tree", real)
    npy_dirs(tmp_path, ["c.npy"])
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy", "c.npy"]  # a file added: listed anew
    for sub in ("x", "y"):
        os.rename(tmp_path / sub / "a.npy", tmp_path / sub / "z.npy")
    assert list(NpyPairs(x, y).names) == ["b.npy", "c.npy", "z.npy"]  # renamed
    for sub in ("x", "y"):
        os.remove(tmp_path / sub / "b.npy")
    assert list(NpyPairs(x, y).names) == ["c.npy", "z.npy"]  # removed


def test_a_change_deep_in_the_tree_is_seen(tmp_path):
    for name in ["k/a/b/1", "k/a/b/2", "k/c/3"]:
        touch(tmp_path / "root" / name)
    root = str(tmp_path / "root")

    def listed():
        got = cached_listing(root, "t", "", build=lambda: list_tree(root))
        return [got.relative(i) for i in range(len(got))]

    assert listed() == ["k/a/b/1", "k/a/b/2", "k/c/3"]
    touch(tmp_path / "root" / "k" / "a" / "b" / "0")
    assert listed() == ["k/a/b/0", "k/a/b/1", "k/a/b/2", "k/c/3"]
    os.rename(tmp_path / "root" / "k" / "c", tmp_path / "root" / "k" / "d")
    assert listed() == ["k/a/b/0", "k/a/b/1", "k/a/b/2", "k/d/3"]


def test_a_damaged_cache_is_rebuilt_never_trusted(tmp_path):
    x, y = npy_dirs(tmp_path, ["a.npy", "b.npy"])
    NpyPairs(x, y)
    cache = x + ".npy-listing.sfidx.npy"
    data = bytearray(open(cache, "rb").read())
    open(cache, "wb").write(data[: len(data) // 2])  # truncated
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy"]
    np.save(cache, np.arange(40, dtype=np.int64))  # foreign
    assert list(NpyPairs(x, y).names) == ["a.npy", "b.npy"]


def test_pickles_as_the_cache_files_name_not_the_list(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    sizes = [
        len(pickle.dumps(NpyPairs(*npy_dirs(root, [f"{k:05d}.npy" for k in range(n)]))))
        for root, n in ((small, 10), (big, 1500))
    ]
    assert sizes[1] - sizes[0] < 50  # independent of the number of files
    source = NpyPairs(str(big / "x"), str(big / "y"))
    copy = pickle.loads(pickle.dumps(source))
    assert list(copy.names) == list(source.names) and copy[7]["x"].tolist() == source[7]["x"].tolist()


def test_a_worker_refuses_a_listing_rebuilt_since(tmp_path):
    x, y = npy_dirs(tmp_path, ["a.npy", "b.npy"])
    shipped = pickle.dumps(NpyPairs(x, y))
    npy_dirs(tmp_path, ["0.npy"])  # the tree changes and a new source lists it again
    NpyPairs(x, y)
    with pytest.raises(DataError, match="rebuilt or removed since"):
        pickle.loads(shipped)


def test_an_unwritable_cache_place_warns_and_still_works_and_pickles(tmp_path):
    x, y = npy_dirs(tmp_path, ["a.npy", "b.npy"])
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not cache the file listing"):
        source = NpyPairs(x, y, cache_dir=blocked / "sub")
    assert list(pickle.loads(pickle.dumps(source)).names) == ["a.npy", "b.npy"]


def test_process_workers_read_the_shared_listing(tmp_path, no_leaks):
    x, y = npy_dirs(tmp_path, [f"{k:03d}.npy" for k in range(40)])
    with Loader(NpyPairs(x, y), 8, workers=2, mode="process", with_ids=True, inline_when_faster=False) as loader:
        batches = list(loader)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(40))
    assert all(float(b["x"][k, 0]) == 7.0 for b in batches for k in range(len(b["id"])))  # "NNN.npy": 7 chars


def test_a_large_tree_shows_progress(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tqdm")
    for k in range(30):
        touch(tmp_path / "t" / f"{k}")
    monkeypatch.setattr(listing_module, "PROGRESS_AFTER", 10)
    list_tree(str(tmp_path / "t"))
    assert "listing" in capsys.readouterr().err
    list_tree(str(tmp_path / "t"), progress=False)
    assert capsys.readouterr().err == ""
