"""The benchmarks' data held in the page cache (``benchmarks/_pinned.py``): a file the keeper
holds stays resident when the kernel is told to drop it, a file beside it is dropped, and the
keeper is gone once the block ends."""

import ctypes
import mmap
import multiprocessing
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _pinned  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and posix_fadvise: Linux"),
]

SIZE = 1 << 20


def resident_pages(path: str) -> int:
    """How many of ``path``'s pages are in the page cache (mincore on a mapping never touched)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
        vector = (ctypes.c_ubyte * -(-len(view) // mmap.PAGESIZE))()
        start = np.frombuffer(view, np.uint8)
        assert libc.mincore(ctypes.c_void_p(start.ctypes.data), ctypes.c_size_t(len(view)), vector) == 0
        del start  # the mapping closes with no view of it left
        return sum(v & 1 for v in vector)


def written(path: str) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())  # clean pages: the kernel may drop them
    return path


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_pinned_files_stay_in_the_page_cache_and_the_keeper_goes_after(tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    pinned_file, loose = written(str(held / "a.npy")), written(str(tmp_path / "loose.npy"))
    drop(loose)
    if resident_pages(loose):
        pytest.skip("this file system keeps pages a DONTNEED names (a tmpfs): nothing to tell apart")
    pages = SIZE // mmap.PAGESIZE
    with _pinned.pinned([str(held)]) as pin:
        assert (pin.files, pin.size, pin.why_not) == (1, SIZE, None)
        drop(pinned_file)
        drop(written(loose))
        assert resident_pages(pinned_file) == pages
        assert resident_pages(loose) == 0
        keepers = [p for p in os.listdir("/proc") if p.isdigit() and _is_keeper(p)]
        assert len(keepers) == 1
        assert "data held in the page cache for the run: 1 MB in 1 files" in pin.text()
    assert not _is_keeper(keepers[0])
    drop(pinned_file)
    assert resident_pages(pinned_file) == 0  # let go with the block


def test_a_process_forked_in_the_block_does_not_keep_the_keeper(tmp_path):
    # a forked child holds the keeper's stdin open too (a Keras pool worker once outlived its
    # pool): the block must still end, and the keeper with it, while the child lives on
    written(str(tmp_path / "a.npy"))
    fork = multiprocessing.get_context("fork")
    release = fork.Event()
    with _pinned.pinned([str(tmp_path)]) as pin:
        assert pin.files == 1
        keepers = [p for p in os.listdir("/proc") if p.isdigit() and _is_keeper(p)]
        child = fork.Process(target=release.wait, args=(60,))
        child.start()
    try:
        assert child.is_alive()
        assert not _is_keeper(keepers[0])
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0


def test_data_too_large_for_memory_is_not_pinned(tmp_path, monkeypatch):
    written(str(tmp_path / "a.npy"))
    monkeypatch.setattr(_pinned, "available_bytes", lambda: SIZE)
    with _pinned.pinned([str(tmp_path)]) as pin:
        assert pin.files == 0
        assert pin.text().startswith("data not held in memory: 1 MB is more than half of the 1 MB available")


def _is_keeper(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.fsencode(os.path.abspath(_pinned.__file__)) in f.read().split(b"\0")
    except OSError:
        return False
