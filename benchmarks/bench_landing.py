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
  tasks of 32 batches, each written into its slot, the slot reused 8 tasks later);
* ``streamed``: what a worker streaming its batches would pay, hand-over included: each process
  takes every other batch (the consumer hands them out in order, so the two must take turns),
  writes it into one of its 4 batch cells of shared memory once the consumer has handed that
  cell back (one byte on a pipe), and tells the consumer which cell (a message on another
  pipe); the consumer, this process, takes the batches in order as views of the cells and
  hands each cell back once its view is gone.

Every destination is made and written once before the timed pass; the streamed pass is timed
from the consumer handing out the first cells to its taking the last batch. Prints pairs/s
(median of ``--rounds`` rounds, the destinations in turn in each) and each one's ratio to the
proxy.
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
import struct
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from _pinned import pinned
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
STREAM_CELLS = 4  # a streaming worker's cells: 2 workers' 4 x 1.5 MB stay within the 16 MB L3
STREAMED = f"streamed ({STREAM_CELLS} cells a worker)"
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
        at = 0 if reused else (b % per_cell) * batch_bytes
        read_into(files[lo : lo + BATCH], sizes, cells[(b // per_cell) % len(cells)][at:], reused)
    return begin, time.perf_counter()


def read_into(files: list[tuple[str, str]], sizes: list[int], cell: memoryview, reused: bool = False) -> None:
    """The files, one after the other, into ``cell`` (``reused``: each into its start)."""
    at = 0
    for pair in files:
        for path, size in zip(pair, sizes):
            fd = os.open(path, os.O_RDONLY)
            try:
                if os.preadv(fd, [cell[at : at + size]], 0) != size:
                    raise OSError(f"{path}: expected {size} bytes")
            finally:
                os.close(fd)
            at = 0 if reused else at + size


def buffer_of(segment: shared_memory.SharedMemory) -> memoryview:
    """The segment's memory (None only once the segment is closed)."""
    assert segment.buf is not None
    return segment.buf


def stream_part(batches: list[list[tuple[str, str]]], cells_name: str, results, tokens) -> None:
    """A streaming worker: each of ``batches`` into a free cell of segment ``cells_name`` (a cell
    is free once its index arrives on ``tokens``), its cell's index sent on ``results``."""
    sizes = [os.path.getsize(p) for p in batches[0][0]]
    cell_bytes = BATCH * sum(sizes)
    segment = shared_memory.SharedMemory(name=cells_name)
    view = buffer_of(segment)
    free: list[int] = []
    results.send_bytes(b"ready")
    try:
        for batch in batches:
            if not free:
                free.extend(os.read(tokens.fileno(), STREAM_CELLS))
            cell = free.pop(0)
            read_into(batch, sizes, view[cell * cell_bytes : (cell + 1) * cell_bytes])
            results.send_bytes(struct.pack("B", cell))
    finally:
        del view
        segment.close()


def streamed_rate(files: list[tuple[str, str]]) -> float:
    """Pairs/s of 2 streaming workers (``stream_part``), every other batch each, their batches
    taken in order here as views of their cells, each cell handed back once its view is gone."""
    sizes = [os.path.getsize(p) for p in files[0]]
    cell_bytes = BATCH * sum(sizes)
    batches = [files[lo : lo + BATCH] for lo in range(0, len(files), BATCH)]
    spawn = multiprocessing.get_context("spawn")
    segments, results, tokens, workers = [], [], [], []
    try:
        for w in range(2):
            segment = shared_memory.SharedMemory(create=True, size=STREAM_CELLS * cell_bytes)
            buffer_of(segment)[:] = bytes(segment.size)  # written once, as every destination is
            segments.append(segment)
            mine, theirs = spawn.Pipe(duplex=False)
            taken, give = spawn.Pipe(duplex=False)
            process = spawn.Process(target=stream_part, args=(batches[w::2], segment.name, theirs, taken))
            process.start()
            theirs.close()
            taken.close()
            results.append(mine)
            tokens.append(give)
            workers.append(process)
        for pipe in results:
            assert pipe.recv_bytes() == b"ready"
        cells = [np.frombuffer(buffer_of(segment), np.uint8) for segment in segments]
        begin = time.perf_counter()
        for give in tokens:
            os.write(give.fileno(), bytes(range(STREAM_CELLS)))
        for b in range(len(batches)):
            (cell,) = struct.unpack("B", results[b % 2].recv_bytes())
            lent = cells[b % 2][cell * cell_bytes : (cell + 1) * cell_bytes]
            del lent  # the consumer's batch gone: its cell goes back
            os.write(tokens[b % 2].fileno(), bytes([cell]))
        rate = len(files) / (time.perf_counter() - begin)
        del cells
        return rate
    finally:
        for process in workers:
            process.join()
        for pipe in [*results, *tokens]:
            pipe.close()
        for segment in segments:
            segment.close()
            segment.unlink()


def measure(files: list, rounds: int) -> dict[str, list[float]]:
    """Pairs/s of every row in ``rounds`` + 1 rounds: the first warms the page cache up, and
    its rates come first (the caller leaves them out)."""
    halves = [files[: len(files) // 2], files[len(files) // 2 :]]
    spawn = multiprocessing.get_context("spawn")
    rates: dict[str, list[float]] = {name: [] for name in [*DESTINATIONS, STREAMED]}
    for _ in range(rounds + 1):
        for name in DESTINATIONS:
            barrier = spawn.Barrier(len(halves))
            with concurrent.futures.ProcessPoolExecutor(len(halves), spawn, start, (barrier,)) as pool:
                spans = list(pool.map(read_part, halves, [name] * len(halves)))
            rates[name].append(len(files) / (max(e for _, e in spans) - min(b for b, _ in spans)))
        rates[STREAMED].append(streamed_rate(files))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="bench_sources.py's --data directory (npy-20000 in it)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    npy = DATASETS["npy"]
    files = list(zip(*npy_files(npy.path(args.data, npy.samples))))  # (input, label) pairs, as the proxy lists them
    with pinned([npy.path(args.data, npy.samples)]) as pin:  # a warm page cache for every row alike
        rates = measure(files, args.rounds)
    print(pin.text())
    proxy = statistics.median(rates["proxy"][1:])
    print(f"{len(files):,} npy pairs, batch {BATCH}, 2 processes; median of {args.rounds} rounds")
    for name, measured in rates.items():
        rate = statistics.median(measured[1:])
        print(f"{name:<28} {rate:>9,.0f} pairs/s  {rate / proxy:.2f}x the proxy")


if __name__ == "__main__":
    main()
