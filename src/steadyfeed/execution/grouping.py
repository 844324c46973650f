"""Several batches in one task: what each batch handed to a worker costs, paid once for a few.

Every task costs the same fixed work whatever its size: the consumer picks a worker and a
slot, pickles and writes the task, selects, reads and unpickles the result, maps its views;
the worker reads the task, sets up its status and output, and sends the result back. With
batches that take well under a millisecond to make (npy pairs of 32, page-cached), that work
was a fifth to a third of the CPU of the whole pipeline on 2 cores. ``batches_per_task=K``
hands ``K`` consecutive batches of the plan to one worker as one task (:func:`merged`): the
worker reads and collates them as one batch of their ids, and the consumer cuts the result
back into the ``K`` batches (:func:`split`), each exactly as a task of its own would have made
it, since a batch's rows are stacked samples and each sample is a pure function of its id,
draw, epoch and seed.

Guarantees (the scheduler keeps them, ``scheduler.py``):

* only batches that a merge cannot change are merged: stacked (``collate="stack"``), no
  padded rows, never tried before (no excluded samples, no attempts counted, not lost);
* a merged task that comes back with anything but rows (a sample failed, its samples cannot
  be collated together, a worker was lost on it) is not cut: each of its batches is made
  again alone, keeping the failures already final (a sample is never tried more often than
  ``retries`` allows, and its failure is the one it had), so what the consumer sees is what
  tasks of one batch would have given;
* samples of merged batches that disagree (one batch of 64 x 64 images, the next of 32 x 32:
  each batch collates, the merge cannot) stop the merging for the life of the pool
  (:class:`Grouping`): such data would pay for every merge twice.

A batch cut from a task is a view of the task's arrays, so a batch kept keeps its task's
batches in memory (and a lent slot, ``shm.py``, holds a task's batches until the last is gone).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config import AUTO, PREFETCH_PER_WORKER, ExecutionOptions, workers_count
from ..sampling.plan import BatchSpec
from . import shm
from .auto import memory_budget
from .pool import SLOTS_PER_WORKER

# "auto" groups batches until a task takes about this long to make: JPEG batches of 32 (3-6 ms
# in a worker on 2 busy cores) ran fastest at 8 a task (2 processes: 22.6-23.1k images/s against
# 22.3-22.6k at 4, 21.7k at 2, 19.1-20.4k at 1), so 8 of them must fit
TASK_SECONDS = 0.05
MAX_BATCHES = 8  # batches one thread's task may hold under "auto"
# ...and one process's: a task shipped to a process costs more (a pickle and a pipe message each
# way, a slot to map), so processes fill TASK_SECONDS with cheap batches where threads stop at 8.
# 2 processes, same run, 8 / 32 a task: npy pairs (1.6 ms a batch) 100k / 105k pairs/s, page-
# cached HDF5 rows in order 195k / 283k rows/s, shuffled 174k / 181k; 4 threads on shuffled
# rows fell to 0.78x of workers=0 at 32 a task (0.98x at 8), hence threads keep 8
MAX_PROCESS_BATCHES = 32
LEARN_BATCHES = 16  # batches made one per task before "auto" picks
# ...after the pool's first SLOTS_PER_WORKER batches a worker, which "auto" does not count: they
# land in memory no batch has used yet (a process worker makes a slot for each of its first tasks,
# its pages faulted in as the batch is written; a thread worker's reused buffers are made the
# same way) while the workers start. npy pairs, 2 processes, one batch a task: the first 16
# batches took 2.7-2.8 ms each (median), the next 16 1.1-1.2 ms, the rest of the epoch 1.0 ms,
# and "auto" picked 6-19 batches a task where the batches after the first called for 32.


@dataclass
class Grouping:
    """How many batches a task holds, kept by the loader for the life of a pool.

    ``size`` is ``ExecutionOptions.batches_per_task``, or under ``"auto"`` 1 until
    ``warmup`` and then ``LEARN_BATCHES`` batches have been made, then what :meth:`learn` picks: enough batches
    for a task of ``TASK_SECONDS`` (the fixed cost of a task, ~0.2-0.4 ms of CPU on both
    sides together, then stays under 1%; the median of ``LEARN_BATCHES`` batches), at
    most ``cap`` (``MAX_BATCHES``, ``MAX_PROCESS_BATCHES`` for processes), ``limit`` (what the
    loader allows: an explicit ``prefetch`` must hold a worker's two tasks) and as many as
    ``room`` bytes hold, ``copies`` times over (the window and, in process mode, the
    workers' slots, each that many batches per batch a task holds). The first ``warmup``
    batches learn nothing (the pool's first, made into fresh memory by workers that are
    starting). ``grows_window``: the
    window (a default ``prefetch``) is counted in tasks, so it grows with ``size``.
    ``stopped`` says why grouping stopped, if it did (it does not start again). ``workers``:
    how many share the tasks (:meth:`size_at` shrinks the last tasks of an epoch to share them)."""

    size: int = 1
    workers: int = 1
    auto: bool = False
    cap: int = MAX_BATCHES
    limit: int = MAX_BATCHES
    room: int | None = None
    copies: int = 1
    warmup: int = 0
    grows_window: bool = False
    stopped: str | None = None
    picked: str | None = None  # under "auto": what it picked and why
    _seconds: list = field(default_factory=list, init=False, repr=False)  # what "auto" learnt so far
    _largest: int = field(default=0, init=False, repr=False)

    @property
    def active(self) -> bool:
        return self.size > 1 and self.stopped is None

    @property
    def learning(self) -> bool:
        """Under "auto", before the size is picked."""
        return self.auto and self.picked is None

    @property
    def in_use(self) -> int:
        """Batches a task holds now."""
        return self.size if self.active else 1

    def size_at(self, remaining: int) -> int:
        """Batches the next task holds with ``remaining`` batches of the epoch from it on:
        ``in_use``, and near the epoch's end at most an equal share of the rest per worker
        (guided self-scheduling), so the workers finish the epoch together. Whole tasks of 8
        left one of 2 processes idle while the other made the epoch's last task (~25 ms of
        JPEG): 2 processes were busy 1.90 of the 2 cores, against 1.95-2.00 with smaller tasks."""
        return max(1, min(self.in_use, -(-remaining // self.workers)))

    @property
    def window_factor(self) -> int:
        """How many times the configured window the scheduler keeps (``grows_window``)."""
        return self.in_use if self.grows_window else 1

    def learn(self, seconds: float, nbytes: int) -> None:
        """A batch made alone took ``seconds`` of work and holds ``nbytes``: under "auto",
        counted until there are enough to pick a size."""
        if not self.learning:
            return
        if self.warmup:
            self.warmup -= 1
            return
        self._seconds.append(seconds)
        self._largest = max(self._largest, nbytes)
        if len(self._seconds) >= LEARN_BATCHES:  # the median: a stray slow batch moves it little
            self.size, self.picked = self._pick(statistics.median(self._seconds), self._largest)

    def _pick(self, seconds: float, nbytes: int) -> tuple[int, str]:
        by_time = batches_for(seconds, self.cap)
        by_room = self.cap if self.room is None or nbytes == 0 else self.room // (self.copies * nbytes)
        size = max(1, min(by_time, by_room, self.limit, self.cap))
        why = (
            f"{size} batch(es) a task: a batch took {seconds * 1e3:.2f} ms to make ({by_time} make a task of "
            f"{TASK_SECONDS * 1e3:.0f} ms), holds {nbytes:,} bytes"
            + (_room_text(by_room) if self.room is not None else "")
            + (f"; prefetch allows {self.limit}" if self.limit < self.cap else "")
        )
        return size, why


def _room_text(fit: int) -> str:
    """What the memory allowed holds, as :meth:`Grouping._pick` says it."""
    if fit >= 1:
        return f" ({fit} fit the memory allowed)"
    return " (not even one batch a task fits the memory allowed: one, the fewest a task can hold)"


def batches_for(seconds: float, cap: int = MAX_BATCHES) -> int:
    """How many batches of ``seconds`` each make a task of ``TASK_SECONDS``, at most ``cap``."""
    return cap if seconds <= 0 else max(1, min(cap, math.ceil(TASK_SECONDS / seconds)))


def per_task_rule(execution: ExecutionOptions, collate: str) -> Callable[[float], int]:
    """How many batches of a given cost a task would hold under these options, by which
    ``workers="auto"`` weighs whether shipping a task to a process is worth it (it asks before
    any pool exists; the memory bound aside). Under "auto" it counts at most ``MAX_BATCHES``,
    as a thread's task: batches so cheap that only a process's longer task would be worth
    shipping stay on threads, where a process pool would cost seconds to start for them."""
    asked = execution.batches_per_task
    if collate != "stack":
        return lambda seconds: 1
    if asked == AUTO:
        return batches_for
    return lambda seconds: int(asked)


def make_grouping(execution: ExecutionOptions, collate: str) -> Grouping:
    """The grouping a new pool of ``execution`` (workers an int) starts with. None under
    ``collate="pad"`` (each batch is padded to its own largest shape), without workers, or
    on Ray unless a size is given (what a Ray task costs was not measured for "auto")."""
    workers = workers_count(execution.workers)
    asked, prefetch = execution.batches_per_task, execution.prefetch
    window = prefetch is None
    if collate != "stack" or workers == 0:
        return Grouping()
    if asked != AUTO:
        return Grouping(size=int(asked), workers=workers, grows_window=window)
    if execution.mode == "ray":
        return Grouping()
    room = memory_budget(execution.max_inflight_bytes)
    copies = execution.effective_prefetch  # the window, in batches per batch a task holds
    if execution.mode == "process":  # and each worker's slots, in shared memory
        copies += workers * SLOTS_PER_WORKER
        free = shm.free_bytes()
        if free is not None:  # at most half of it: the slots of other loaders, other programs
            room = free // 2 if room is None else min(room, free // 2)
    cap = MAX_PROCESS_BATCHES if execution.mode == "process" else MAX_BATCHES
    limit = cap if prefetch is None else max(1, prefetch // (PREFETCH_PER_WORKER * workers))
    warmup = workers * SLOTS_PER_WORKER  # the pool's first batches, into fresh memory
    return Grouping(
        auto=True,
        workers=workers,
        cap=cap,
        limit=limit,
        room=room,
        copies=copies,
        warmup=warmup,
        grows_window=window,
    )


def mergeable(spec: BatchSpec) -> bool:
    """Whether ``spec`` may share a task: its rows are exactly its ids (no padded rows, no
    fillers). Stacking is the loader's to check: it groups only under ``collate="stack"``."""
    return spec.pad_to is None and spec.num_real == len(spec.ids)


def merged(specs: list[BatchSpec]) -> BatchSpec:
    """One spec for consecutive mergeable ``specs``: their ids (and draws) in order, the first's index."""
    first = specs[0]
    draws = None if first.draws is None else np.concatenate([s.draws for s in specs])
    ids = np.concatenate([s.ids for s in specs])
    return BatchSpec(first.index, ids, draws, None, len(ids))


def split(arrays: dict[str, np.ndarray], specs: list[BatchSpec]) -> list[dict[str, np.ndarray]]:
    """The rows of a merged batch (every sample read, none failed) as ``specs``' batches: views."""
    cuts = np.cumsum([0] + [len(s.ids) for s in specs]).tolist()
    return [{key: column[lo:hi] for key, column in arrays.items()} for lo, hi in zip(cuts[:-1], cuts[1:])]


def member_at(specs: list[BatchSpec], position: int) -> tuple[int, int]:
    """Which of ``specs`` (its number) holds ``position`` of their merged spec, and where in it."""
    for k, spec in enumerate(specs):
        if position < len(spec.ids):
            return k, position
        position -= len(spec.ids)
    raise IndexError(f"position past the merged batch's {sum(len(s.ids) for s in specs)} rows")
