"""Where a batch's bytes land: the npy raw read (issue 15's limit proxy) into other destinations.

The proxy of ``bench_sources.py`` ("raw read by 2 processes") reads every byte of the 20,000
``.npy`` pairs into one reused 1 MB buffer: the bytes land in the core's caches and go no
further. A loader's batches must land somewhere they stay, and that costs memory traffic.
Here the same loop (``os.open``, one ``preadv``, ``os.close`` per file; 2 spawned processes,
one contiguous half each, started together at a barrier) reads the files into:

* ``proxy``: one reused buffer that starts 2 KB past a 4 KB page, as the proxy's does
  (``bench_sources.RAW_READ_PAGE_OFFSET``);
* ``16 bytes past a page``: the same, starting 16 bytes past a page, where a process's first
  ``bytearray`` of 1 MB starts (glibc maps it, after its 16-byte header; later ones come from
  the heap, at any offset). A file read from offset 0 starts at a page's start, so each store
  of the kernel's copy lands 16 bytes past its source's place in a page, and the loads that
  follow wait on it (4K aliasing: the CPU matches loads against earlier stores by their low
  12 bits first);
* ``ring of N``: N batch-sized cells of shared memory, batch after batch in turn (what a
  worker that reused a few cells would write: 2 cells of 1.5 MB, or 8 making 12.6 MB, within
  the 16 MB L3 cache of the VM of docs/benchmarks.md);
* ``task slots``: 8 shared-memory slots of 32 batches each, in turn (a process worker's
  tasks of 32 batches, each written into its slot, the slot reused 8 tasks later).

Every destination is made and written once before the timed pass. Prints pairs/s (median of
``--rounds`` rounds, the destinations in turn in each) and each one's ratio to the proxy.
Run from the repository root, on the data ``bench_sources.py --data DIR`` keeps:

    .venv/bin/python benchmarks/bench_landing.py --data /tmp/sfbench
"""

from __future__ import annotations

import argparse
import concurrent.futures
import mmap
import multiprocessing
import os
import statistics
import time
from typing import Any

from bench_sources import DATASETS, RAW_READ_PAGE_OFFSET, npy_files, page_placed

BATCH = 32
# name: (cells, batches a cell); an int: one reused buffer, starting that many bytes past a page
DESTINATIONS: dict[str, tuple[int, int] | int] = {
    "proxy": RAW_READ_PAGE_OFFSET,
    "16 bytes past a page": 16,
    "ring of 2": (2, 1),
    "ring of 8": (8, 1),
    "task slots (8 x 32 batches)": (8, 32),
}
_BARRIER: Any = None  # the processes start their timed pass together (set by the initializer)


def start(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def destination(shape: tuple[int, int] | int, batch_bytes: int) -> list[memoryview]:
    """The cells batches are written into, each touched once (no first-write faults timed)."""
    if isinstance(shape, int):
        return [page_placed(1 << 20, shape)]
    cells, batches = shape
    views = []
    for _ in range(cells):
        segment = mmap.mmap(-1, batches * batch_bytes)  # shared and anonymous: shmem, like /dev/shm
        segment.write(bytes(len(segment)))
        views.append(memoryview(segment))
    return views


def read_part(files: list[tuple[str, str]], name: str) -> tuple[float, float]:
    """Every byte of ``files`` read into ``name``'s destination; the timed pass's start and end."""
    sizes = [os.path.getsize(p) for p in files[0]]
    shape = DESTINATIONS[name]
    batch_bytes = BATCH * sum(sizes)
    cells = destination(shape, batch_bytes)
    reused = isinstance(shape, int)  # every file read into the buffer's start, as the proxy does
    per_cell = 1 if isinstance(shape, int) else shape[1]
    _BARRIER.wait()
    begin = time.perf_counter()
    for b, lo in enumerate(range(0, len(files), BATCH)):
        cell = cells[(b // per_cell) % len(cells)]
        at = 0 if reused else (b % per_cell) * batch_bytes
        for pair in files[lo : lo + BATCH]:
            for path, size in zip(pair, sizes):
                fd = os.open(path, os.O_RDONLY)
                try:
                    if os.preadv(fd, [cell[at : at + size]], 0) != size:
                        raise OSError(f"{path}: expected {size} bytes")
                finally:
                    os.close(fd)
                at = 0 if reused else at + size
    return begin, time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="bench_sources.py's --data directory (npy-20000 in it)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    npy = DATASETS["npy"]
    files = list(zip(*npy_files(npy.path(args.data, npy.samples))))  # (input, label) pairs, as the proxy lists them
    halves = [files[: len(files) // 2], files[len(files) // 2 :]]
    spawn = multiprocessing.get_context("spawn")
    rates: dict[str, list[float]] = {name: [] for name in DESTINATIONS}
    for _ in range(args.rounds + 1):  # the first round warms the page cache up, untimed
        for name in DESTINATIONS:
            barrier = spawn.Barrier(len(halves))
            with concurrent.futures.ProcessPoolExecutor(len(halves), spawn, start, (barrier,)) as pool:
                spans = list(pool.map(read_part, halves, [name] * len(halves)))
            rates[name].append(len(files) / (max(e for _, e in spans) - min(b for b, _ in spans)))
    proxy = statistics.median(rates["proxy"][1:])
    print(f"{len(files):,} npy pairs, batch {BATCH}, 2 processes; median of {args.rounds} rounds")
    for name, measured in rates.items():
        rate = statistics.median(measured[1:])
        print(f"{name:<28} {rate:>9,.0f} pairs/s  {rate / proxy:.2f}x the proxy")


if __name__ == "__main__":
    main()
