"""A benchmark's data held in the page cache for the length of a run.

Warm-cache benchmarks compare loaders that read the same bytes from memory. A kernel may drop
page cache that sits idle between two loaders' epochs: the 2-core VM of the twenty-fourth
session runs DAMON with a ``pageout`` scheme on unmapped file pages idle for about a minute
(``/sys/kernel/mm/damon/admin``: physical addresses, age >= 12 aggregations of 5 s, up to
128 MB/s), and one ``bench_sources.py --only npy`` run read 566 MB of its 1.1 GB back from disk,
in whichever epoch came next: a loader or a limit proxy timed partly on the disk.

:func:`pinned` starts a keeper process that maps every file (``MAP_POPULATE``: read into the
page cache now) and locks its mappings (``mlockall``): locked pages are never reclaimed, and
mapped ones are left to the last by reclaim (and skipped by a scheme for unmapped pages). The
keeper is a process of its own so that no measured process carries 40,000 extra mappings; it
exits when the block ends or its stdin closes, so it cannot outlive the benchmark that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MCL_CURRENT = 1
HALF_OF_AVAILABLE = 0.5  # data larger than this share of the available memory is not pinned


@dataclass(frozen=True)
class Pin:
    """What :func:`pinned` holds: ``files`` and ``size`` bytes mapped, ``locked`` when
    ``mlockall`` succeeded; ``why_not`` when nothing is held."""

    files: int = 0
    size: int = 0
    locked: bool = False
    why_not: str | None = None

    def text(self) -> str:
        if self.why_not:
            return f"data not held in memory: {self.why_not}"
        how = "locked (mlockall)" if self.locked else "mapped, not locked (mlockall refused)"
        return (
            f"data held in the page cache for the run: {self.size / 1e6:,.0f} MB in {self.files:,} files, "
            f"{how}, by a keeper process (benchmarks/_pinned.py)"
        )


def files_under(roots: list[str]) -> list[str]:
    """Every regular file under ``roots`` (files or directories), in a stable order."""
    found = []
    for root in roots:
        if os.path.isfile(root):
            found.append(root)
        for folder, _, names in sorted(os.walk(root)):
            found.extend(os.path.join(folder, name) for name in sorted(names))
    return found


def available_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextmanager
def pinned(roots: list[str]) -> Iterator[Pin]:
    """The files under ``roots`` held in the page cache until the block ends (see the module
    docstring). Holds nothing, and says why, off Linux or where the files would take more
    than half of the available memory."""
    paths = files_under(roots)
    size = sum(os.path.getsize(p) for p in paths)
    available = available_bytes()
    if not sys.platform.startswith("linux"):
        yield Pin(why_not="not on Linux")
        return
    if available is None:
        yield Pin(why_not="no /proc/meminfo to size it against")
        return
    if size > HALF_OF_AVAILABLE * available:
        yield Pin(why_not=f"{size / 1e6:,.0f} MB is more than half of the {available / 1e6:,.0f} MB available")
        return
    keeper = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert keeper.stdin is not None and keeper.stdout is not None  # both piped above
    try:
        keeper.stdin.write("".join(p + "\n" for p in paths) + "\n")  # an empty line ends the list
        keeper.stdin.flush()
        said = keeper.stdout.readline().split()
        if len(said) != 3:
            yield Pin(why_not="the keeper process failed (its error is above)")
            return
        yield Pin(int(said[0]), int(said[1]), said[2] == "locked")
    finally:
        # the keeper's signal to go is a line, not the end of its stdin: a process forked in the
        # block (a Keras or torch pool worker of a peer) holds this pipe open as well, and one
        # that outlived its pool once kept a run waiting here for good
        with contextlib.suppress(OSError):  # the keeper is gone already (its error is above)
            keeper.stdin.write("\n")
            keeper.stdin.close()
        keeper.wait()


def keep() -> None:
    """The keeper: maps the files named on stdin (one a line, an empty line after the last),
    locks what it mapped, says ``files bytes locked|mapped`` and holds them until the benchmark
    says go (a line) or exits (the end of stdin)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    failed = ctypes.c_void_p(-1).value
    files = held = 0
    for line in sys.stdin:
        if line == "\n":
            break
        try:
            fd = os.open(line[:-1], os.O_RDONLY)
        except OSError:  # gone or unreadable: the benchmark will say so, not the keeper
            continue
        try:
            size = os.fstat(fd).st_size
            # libc's mmap, not the mmap module's: that one keeps a duplicate of each file's
            # descriptor, and 40,000 files would exceed the descriptor limit
            if size and libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | mmap.MAP_POPULATE, fd, 0) != failed:
                files, held = files + 1, held + size
        finally:
            os.close(fd)
    locked = libc.mlockall(MCL_CURRENT) == 0
    print(files, held, "locked" if locked else "mapped", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    keep()
