"""MemoryCache and DiskCache: decoded once, augmented afresh every epoch, never corrupted."""

import io
import os
import pickle
import shutil
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers import BigSource, epoch_digest, label_of, noisy, paired_source

from steadyfeed import ArraySource, DataError, Loader, SampleError
from steadyfeed.sources import cache as cache_module
from steadyfeed.sources.base import fingerprint, locate
from steadyfeed.sources.cache import DiskCache, MemoryCache

pytestmark = pytest.mark.timeout(60)

N, WIDTH = 64, 4
CACHES = [
    pytest.param(lambda src, tmp: MemoryCache(src, 1 << 20), id="memory"),
    pytest.param(lambda src, tmp: DiskCache(src, tmp / "cache"), id="disk"),
]


class CountingSource:
    """A paired source that logs every read to ``log_dir`` (a file per process, so reads in
    worker processes count too), returns fresh arrays like a decoder, and whose
    fingerprint follows ``version``."""

    def __init__(self, log_dir, n=N, version="1", delay=0.0):
        self.x = np.arange(n * WIDTH, dtype=np.float64).reshape(n, WIDTH)
        self.y = label_of(self.x)
        self.log_dir, self.version, self.delay = str(log_dir), version, delay
        self.closed = 0
        os.makedirs(self.log_dir, exist_ok=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        with open(os.path.join(self.log_dir, f"reads-{os.getpid()}"), "a") as f:
            f.write(f"{i}\n")
        if self.delay:  # widens the window in which threads miss the same id together
            time.sleep(self.delay)
        return {"x": self.x[i].copy(), "y": self.y[i].copy()}

    def locate(self, i):
        return f"row {i}"

    def fingerprint(self):
        return f"counting-v{self.version}"

    def close(self):
        self.closed += 1


def reads(log_dir) -> int:
    return sum(len(log.read_text().split()) for log in Path(log_dir).glob("reads-*"))


class GrowingSource:
    """Sample 0 is small, the others ten times larger: the estimate from sample 0 is too low."""

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return {"x": np.full(1 if i == 0 else 10, float(i))}


def shift_in_place(sample, rng):
    """A transform that writes into its input, as many augmentations do."""
    sample["x"] += rng.normal(size=sample["x"].shape)
    return sample


def digests(source, epochs=(0, 1, 2), workers=0, mode="thread", transform=noisy):
    with Loader(
        source, 16, shuffle=True, seed=3, transform=transform, workers=workers, mode=mode, with_ids=True
    ) as loader:
        return [epoch_digest(loader.epoch(e)) for e in epochs]


# -- augmentation stays random, results stay reproducible ---------------------------------------
@pytest.mark.parametrize("make", CACHES)
def test_transform_stays_random_and_identical_for_any_worker_count(make, tmp_path, no_leaks):
    reference = digests(CountingSource(tmp_path / "plain"))
    assert len(set(reference)) == 3  # each epoch augments differently
    for workers in (0, 2):
        cache = make(CountingSource(tmp_path / f"log{workers}"), tmp_path / f"w{workers}")
        assert digests(cache, workers=workers) == reference, f"workers={workers}"


@pytest.mark.parametrize("make", CACHES)
def test_same_sample_gets_different_augmentation_each_epoch(make, tmp_path):
    cache = make(CountingSource(tmp_path / "log"), tmp_path)
    with Loader(cache, 8, seed=1, transform=noisy, with_ids=True) as loader:
        first, second = next(iter(loader.epoch(0))), next(iter(loader.epoch(1)))
    np.testing.assert_array_equal(first["id"], second["id"])
    np.testing.assert_array_equal(first["y"], second["y"])
    assert not np.any(first["x"] == second["x"])


@pytest.mark.parametrize("make", CACHES)
def test_second_epoch_is_served_from_the_cache(make, tmp_path, no_leaks):
    log = tmp_path / "log"
    cache = make(CountingSource(log), tmp_path)
    before = reads(log)  # MemoryCache reads sample 0 once to estimate its size
    with Loader(cache, 16, shuffle=True, workers=2, mode="thread") as loader:
        list(loader.epoch(0))
        assert (cache.stats()["hits"], cache.stats()["misses"], reads(log) - before) == (0, N, N)
        list(loader.epoch(1))
        assert (cache.stats()["hits"], cache.stats()["misses"], reads(log) - before) == (N, N, N)


@pytest.mark.parametrize("make", CACHES)
def test_a_transform_writing_into_its_input_cannot_corrupt_the_cache(make, tmp_path, no_leaks):
    reference = digests(CountingSource(tmp_path / "plain"), transform=shift_in_place)
    cache = make(CountingSource(tmp_path / "log"), tmp_path)
    assert digests(cache, workers=2, transform=shift_in_place) == reference
    sample = cache[3]
    sample["x"][:] = -1.0
    np.testing.assert_array_equal(cache[3]["x"], np.arange(12.0, 16.0))


@pytest.mark.parametrize("make", CACHES)
def test_process_workers_read_through_the_cache(make, tmp_path, no_leaks):
    log = tmp_path / "log"
    reference = digests(CountingSource(tmp_path / "plain"))
    cache = make(CountingSource(log), tmp_path)
    before = reads(log)
    assert digests(cache, workers=2, mode="process") == reference
    # 3 epochs uncached would read 3 * N; a memory cache per worker reads each sample at most
    # once per worker, the shared disk cache exactly once
    assert N <= reads(log) - before <= (2 * N if isinstance(cache, MemoryCache) else N)


# -- the memory budget --------------------------------------------------------------------------
def test_memory_cache_larger_than_its_budget_is_refused_up_front():
    source = BigSource(1000, 8000)
    with pytest.raises(DataError, match=r"needs about 8,000,000 bytes .*max_bytes=1,000,000 bytes.*DiskCache"):
        MemoryCache(source, 1_000_000)
    assert MemoryCache(source, 8_000_000).estimate == 8_000_000


def test_memory_cache_stops_at_its_budget_while_growing(no_leaks):
    cache = MemoryCache(GrowingSource(), max_bytes=8 * 100 * 2)  # twice the estimate, a fifth of the need
    expected = r"sample 20 \(80 bytes\) does not fit in max_bytes=1,600 bytes.*holds 1,528 bytes.*estimate was 800"
    with pytest.raises(DataError, match=expected):
        for i in range(100):
            cache[i]
    assert cache.stats()["bytes"] <= 1600
    with Loader(cache, 1, workers=2) as loader, pytest.raises(SampleError) as info:  # 1: shapes differ
        list(loader)
    assert isinstance(info.value.__cause__, DataError)
    assert cache.stats()["bytes"] <= 1600


# -- the disk cache across runs -----------------------------------------------------------------
def test_disk_cache_is_reused_by_a_new_instance_without_reading_the_source(tmp_path, no_leaks):
    first = digests(DiskCache(CountingSource(tmp_path / "log1"), tmp_path / "cache"), workers=2)
    log = tmp_path / "log2"
    again = DiskCache(CountingSource(log), tmp_path / "cache")
    assert digests(again, workers=2) == first
    assert reads(log) == 0
    assert again.stats()["hits"] == 3 * N and again.stats()["misses"] == 0


def test_disk_cache_is_invalidated_when_the_fingerprint_changes(tmp_path):
    def fill(version, log):
        cache = DiskCache(CountingSource(tmp_path / log, version=version), tmp_path / "cache")
        [cache[i] for i in range(N)]
        return cache

    old = fill("1", "a")
    new = fill("2", "b")
    assert new.path != old.path and reads(tmp_path / "b") == N  # nothing of version 1 was served
    (tmp_path / "cache" / "not-ours").mkdir()
    assert new.prune() == [old.path]
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(["not-ours", os.path.basename(new.path)])
    fill("2", "c")
    assert reads(tmp_path / "c") == 0


def test_a_source_without_fingerprint_needs_a_key(tmp_path):
    source = paired_source(10)
    with pytest.raises(ValueError, match=r"no fingerprint\(\) method. Pass key="):
        DiskCache(source, tmp_path)
    v1, v2 = DiskCache(source, tmp_path, key="v1"), DiskCache(source, tmp_path, key="v2")
    assert v1.path != v2.path
    np.testing.assert_array_equal(v1[4]["x"], source[4]["x"])


def test_corrupt_cache_files_are_misses_that_get_rewritten(tmp_path):
    cache = DiskCache(CountingSource(tmp_path / "log1"), tmp_path / "cache")
    [cache[i] for i in range(N)]
    files = {i: Path(cache._file(i)) for i in (1, 2, 3, 5, 6)}
    blob = files[1].read_bytes()
    files[1].write_bytes(blob[:-6] + bytes([blob[-6] ^ 1]) + blob[-5:])  # one bit of y (before the CRC)
    files[2].write_bytes(blob[: len(blob) // 2])  # truncated
    files[3].write_bytes(b"not a cache file")
    os.replace(files[5], files[6])  # a valid file under the wrong sample id
    log = tmp_path / "log2"
    source = CountingSource(log)
    again = DiskCache(source, tmp_path / "cache")
    with pytest.warns(RuntimeWarning, match="not a valid cache file") as caught:
        for i in range(N):
            sample = again[i]
            np.testing.assert_array_equal(sample["x"], source.x[i])
            np.testing.assert_array_equal(sample["y"], source.y[i])
    assert len(caught) == 4 and again.stats()["corrupt"] == 4 and reads(log) == 5  # 5 was gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = DiskCache(source, tmp_path / "cache")
        [third[i] for i in range(N)]
    assert third.stats()["hits"] == N


def test_an_unwritable_cache_serves_the_source_and_warns_once(tmp_path):
    source = CountingSource(tmp_path / "log")
    cache = DiskCache(source, tmp_path / "cache")
    shutil.rmtree(cache.path)
    Path(cache.path).write_text("a file where the cache directory was")  # even root cannot write there
    with pytest.warns(RuntimeWarning, match="cannot write to") as caught:
        for i in range(10):
            np.testing.assert_array_equal(cache[i]["x"], source.x[i])
    assert len(caught) == 1 and cache.stats()["write_errors"] == 10 and reads(tmp_path / "log") == 10


class Booby:
    def __reduce__(self):
        return (_touch, (os.environ["STEADYFEED_TEST_MARKER"],))


def _touch(path):
    open(path, "w").close()
    return "unpickled"


def test_a_cache_file_is_never_unpickled(tmp_path, monkeypatch):
    marker = tmp_path / "code-ran"
    monkeypatch.setenv("STEADYFEED_TEST_MARKER", str(marker))
    source = CountingSource(tmp_path / "log")
    cache = DiskCache(source, tmp_path / "cache")
    with monkeypatch.context() as forger:  # a forger with our code: header and checksum are right
        forger.setattr(cache_module, "_npy_bytes", pickling_npy)
        forged = cache_module._encode({"x": np.array([Booby()], dtype=object), "y": source.y[7]}, 7)
    Path(cache._file(7)).write_bytes(forged)
    with pytest.warns(RuntimeWarning, match="allow_pickle"):
        np.testing.assert_array_equal(cache[7]["x"], source.x[7])
    assert not marker.exists()


def pickling_npy(arr):
    out = io.BytesIO()
    np.lib.format.write_array(out, arr, allow_pickle=True)
    return out.getvalue()


# -- concurrency and the source protocol --------------------------------------------------------
@pytest.mark.parametrize("make", CACHES)
def test_many_threads_at_once(make, tmp_path):
    source = CountingSource(tmp_path / "log", delay=0.001)
    cache = make(source, tmp_path)
    ids = np.random.default_rng(0).integers(0, N, size=800)

    def check(i):
        sample = cache[int(i)] if i % 2 else cache.read_many([int(i), int(i) ^ 1])[0]
        np.testing.assert_array_equal(sample["x"], source.x[i])
        np.testing.assert_array_equal(sample["y"], source.y[i])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, ids))
    stats = cache.stats()
    assert stats["hits"] + stats["misses"] == len(ids) + np.count_nonzero(ids % 2 == 0)
    if isinstance(cache, MemoryCache):
        assert stats["items"] == N and stats["bytes"] == N * 8 * (WIDTH + 1)  # x and y, stored once each
    else:
        names = os.listdir(cache.path)
        assert sum(n.endswith(".sample") for n in names) == N and not any(n.endswith(".tmp") for n in names)


@pytest.mark.parametrize("make", CACHES)
def test_a_cache_is_a_source(make, tmp_path):
    source = CountingSource(tmp_path / "log")
    cache = make(source, tmp_path)
    assert len(cache) == N and locate(cache, 5) == "row 5" and fingerprint(cache) == "counting-v1"
    with pytest.raises(IndexError, match="out of range"):
        cache[N]
    cache[0]
    back = pickle.loads(pickle.dumps(cache))
    assert back.stats()["hits"] == back.stats()["misses"] == back.stats().get("items", 0) == 0  # per process
    np.testing.assert_array_equal(back[9]["y"], source.y[9])
    cache.close()
    hits = cache.stats()["hits"]
    cache[0]
    assert source.closed == 1 and cache.stats()["hits"] == hits + 1  # closing the source keeps the cache


def test_a_cache_refuses_python_objects_and_sources_without_extras_stay_without(tmp_path):
    plain = MemoryCache(paired_source(4), 1 << 10)
    assert fingerprint(plain) is None and locate(plain, 1) is not None
    with pytest.raises(TypeError, match="dtype object"):
        MemoryCache([{"x": [1, "a", None]}], 1 << 10)


def test_memory_cache_pickles_without_its_contents_and_reads_batches():
    import pickle

    src = ArraySource(x=np.arange(100 * 50, dtype=np.float64).reshape(100, 50))
    cache = MemoryCache(src, 10**7)
    for i in range(100):
        cache[i]
    assert len(pickle.dumps(cache)) - len(pickle.dumps(src)) < 2000  # 40 KB of cached rows stay home
    batch = cache.read_batch([7, 3, 7])
    np.testing.assert_array_equal(batch["x"], src.arrays["x"][[7, 3, 7]])
    batch["x"][...] = -1  # fresh arrays: writing to them leaves the cache intact
    np.testing.assert_array_equal(cache[7]["x"], src.arrays["x"][7])
