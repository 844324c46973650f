"""Pools: the protocol of ``protocol.py`` carried out by no workers, threads or processes
(and, in ``ray_pool.py``, Ray actors), with the bookkeeping they share in :class:`WorkerPool`.

A worker is *lost* when it dies (a process killed by a signal, a thread hit by a
``BaseException``, an actor whose process or node went away) or when the sample it is on
runs past ``timeout``; the pool then replaces it and reports ``Lost``, and the scheduler
decides what the lost tasks become (``scheduler.py``). Death is seen at once (process
sentinels, the thread's own report), timeouts within a poll interval.
"""

from __future__ import annotations

import queue
import warnings
from collections.abc import Callable
from operator import methodcaller
from typing import Any

from ..errors import SharedMemoryFull
from ..sources.base import numpy_allocator
from ..stats import LoaderStats
from ..units import human_bytes
from . import shm
from .batch import output_is_copied, run_batch
from .inbox import ResultInbox
from .protocol import Done, Event, Lost
from .recycle import RecycledBuffers
from .sender import TaskSender
from .task import BatchResult, BatchTask, StatusSlot, WorkContext
from .workers import ProcessWorker, ThreadWorker, process_context

TASKS_PER_WORKER = 2  # one running, one queued behind it, so no worker idles between tasks
# a process worker's shared-memory slots: its tasks in flight, and the batches it may have lent
SLOTS_PER_WORKER = TASKS_PER_WORKER + shm.LENT_SLOTS


def finish_each(pending: list, finish: Callable[[Any], object]) -> None:
    """``finish(item)`` for each of ``pending`` in turn, each removed once finished: a call that
    raises (a Ctrl-C) leaves its item and the rest in ``pending``, for a later call to finish."""
    while pending:
        finish(pending[0])
        del pending[0]


class InlinePool:
    """workers=0: no workers; the consumer makes every batch with ``run_here``."""

    def __init__(self, ctx: WorkContext):
        self.ctx = ctx
        self._status = StatusSlot([-1, -1, 0.0])

    def free_slots(self) -> int:
        return 0

    @property
    def all_delivered(self) -> bool:
        return True

    def idle_workers(self) -> int:
        return 0

    def submit(self, task: BatchTask) -> None:
        raise RuntimeError("steadyfeed bug: a task was submitted to a pool without workers")

    def run_here(self, task: BatchTask) -> BatchResult:
        return run_batch(task, self.ctx, self._status)

    def drain(self) -> list[Event]:
        return []

    def wait(self, timeout: float) -> list[Event]:
        raise RuntimeError("steadyfeed bug: waited on a pool without workers")  # a spin would be a hang

    def shutdown(self) -> None:
        pass


class WorkerPool(InlinePool):
    """What every pool of workers shares: starting ``size`` workers, handing each task to the
    least busy one, at most ``TASKS_PER_WORKER`` per worker, finding samples past ``timeout``,
    and replacing a lost worker. A subclass makes the workers (``_new_worker``) and collects
    their news (``_collect``)."""

    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        super().__init__(ctx)
        self.size, self.timeout = size, timeout
        self.workers: dict = {}
        self._next_wid = 0
        self._last_task: dict[int, int] = {}  # wid -> the id of the last task it was given
        self._delivered: set[int] = set()  # wids that have returned a result
        self._stopping: list = []  # workers a shutdown has yet to release
        try:
            for _ in range(size):
                self._spawn()
            self._started()
        except BaseException:
            self.shutdown()  # a worker that failed to start must not strand the ones that did
            raise

    # -- for subclasses ------------------------------------------------------------------
    def _new_worker(self, wid: int):
        raise NotImplementedError

    def _collect(self, timeout: float) -> list[Event]:
        """Events, waiting up to ``timeout`` seconds for the first."""
        raise NotImplementedError

    def _started(self) -> None:
        """Called once the first workers are spawned."""

    def _prepare(self, task: BatchTask, worker) -> BatchTask:
        """The task as ``worker`` is to get it."""
        return task

    def _check(self) -> list[Event]:
        """Whatever must be looked at between waits; by default, the timeouts."""
        return self._expire_timeouts()

    def _before_respawn(self, cause: str) -> None:
        """Called when a worker was lost, before its replacement starts."""

    def _last_status(self, worker, cause: str, detail: str):
        """``(running, detail)`` of a worker being lost: where it was, as the consumer last saw
        it (a pool whose workers can say more after they are gone overrides this)."""
        return worker.running(), detail

    def _wait_interval(self, timeout: float) -> float:
        """The longest single wait: timeouts must be looked at in time."""
        return timeout if self.timeout is None else min(timeout, max(self.timeout / 4, 0.01))

    # -- the protocol --------------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(TASKS_PER_WORKER - len(w.outstanding) for w in self.workers.values())

    @property
    def all_delivered(self) -> bool:
        """Whether every worker now in the pool has returned a result (so has started: a spawned
        worker may take seconds, where the main script imports a framework)."""
        return self._delivered.issuperset(self.workers)

    def idle_workers(self) -> int:
        return sum(not w.outstanding for w in self.workers.values())

    def submit(self, task: BatchTask) -> None:
        wid = self._least_busy()
        self._last_task[wid] = task.task_id
        worker = self.workers[wid]
        worker.send(self._prepare(task, worker))

    def _least_busy(self) -> int:
        """The worker to send a task to: the least of :meth:`_load`."""
        return min(self.workers, key=self._load)

    def _load(self, wid: int) -> tuple:
        """Worker ``wid``'s tasks, then how old its last task is: a consumer slower than its
        workers finds them all idle at every submit, and its batches then go round them all, not
        all to the first (a process worker lends only so many batches at once, ``ProcessPool``)."""
        return len(self.workers[wid].outstanding), self._last_task.get(wid, -1)

    def wait(self, timeout: float) -> list[Event]:
        return self._collect(self._wait_interval(timeout)) + self._check()

    def drain(self) -> list[Event]:
        return self._collect(0) + self._check()

    def shutdown(self) -> None:
        """Stop every worker. A Ctrl-C while waiting for one (a second press: the first stopped the
        epoch) stops the waiting: that worker and the rest are killed (threads left) at once. A
        press even then ends the call, and the workers not released yet are left to the next
        call (each worker's ``stop`` and ``abandon`` may run again where an interrupted one left
        off), which the loader makes when it closes (``loader._retire``)."""
        self._stopping += self.workers.values()
        self.workers = {}
        for worker in self._stopping:  # tell every worker first, so they stop in parallel
            worker.signal_stop()
        try:
            finish_each(self._stopping, methodcaller("stop"))
        except KeyboardInterrupt:  # wait no more: kill (or leave) the rest
            finish_each(self._stopping, methodcaller("abandon"))
            raise

    # -- shared bookkeeping ----------------------------------------------------------------
    def _spawn(self) -> None:
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        self.workers[wid] = self._new_worker(wid)

    def _done(self, wid: int, result: BatchResult) -> list[Event]:
        """A worker's result: [Done], or nothing for a worker already lost (its tasks re-ran)."""
        worker = self.workers.get(wid)
        if worker is None:
            return []
        worker.outstanding.pop(result.task_id, None)
        self._delivered.add(wid)
        return [Done(result)]

    def _lose(self, wid: int, cause: str, detail: str) -> Lost:
        worker = self.workers.pop(wid)
        self._last_task.pop(wid, None)
        try:
            running, detail = self._last_status(worker, cause, detail)  # before it is stopped: where it was
        finally:  # even when finding that out raises (a Ray cluster found gone): release what it holds
            worker.abandon()
        self._before_respawn(cause)
        self._spawn()
        return Lost(tuple(worker.outstanding.values()), running, cause, detail)

    def _expire_timeouts(self) -> list[Event]:
        if self.timeout is None:
            return []
        late = [
            wid
            for wid, worker in self.workers.items()
            if (r := worker.running()) is not None and r.in_sample and r.elapsed > self.timeout
        ]
        return [self._lose(wid, "timeout", f"ran past timeout={self.timeout}s") for wid in late]


class _MessagePool(WorkerPool):
    """Workers whose news comes as messages: ``("done", wid, result)``, ``("died", wid,
    detail)`` and, in process mode, ``("short", wid, (slot, shortage))``. A subclass collects
    them (``_collect``)."""

    def _events(self, messages) -> list[Event]:
        return [event for message in messages for event in self._handle(*message)]

    def _handle(self, kind: str, wid: int, payload) -> list[Event]:
        if kind == "died":
            worker = self.workers.get(wid)
            return [] if worker is None else [self._lose(wid, "died", worker.death_detail(payload))]
        if kind == "short":
            self._short_of_shm(payload)
            return []
        return self._done(wid, payload)

    def _short_of_shm(self, where: tuple[str, shm.Shortage]) -> None:
        raise RuntimeError("steadyfeed bug: a pool without shared memory reported a shortage of it")


class ThreadPool(_MessagePool):
    """Worker threads; their news arrives on one queue, so waiting is one blocking ``get``."""

    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # as many buffers wait for reuse as a process worker has slots
        self._buffers = RecycledBuffers(keep=size * SLOTS_PER_WORKER)
        super().__init__(ctx, size, timeout)

    def _collect(self, timeout: float) -> list[Event]:
        if timeout <= 0 and self._outbox.empty():
            return []  # the common case of drain(): nothing new, no exception raised and caught
        messages = []
        try:
            messages.append(self._outbox.get(timeout=timeout))
            while True:
                messages.append(self._outbox.get_nowait())
        except queue.Empty:
            return self._events(messages)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._buffers.close()

    def _new_worker(self, wid: int) -> ThreadWorker:
        allocate = self._buffers if output_is_copied(self.ctx) else numpy_allocator
        return ThreadWorker(wid, self.ctx, self._outbox, allocate)


class ProcessPool(_MessagePool):
    """Worker processes. The consumer's thread writes their tasks (``sender.py``) and, when it
    waits or drains, takes their results off the pipes and their batches out of shared memory,
    lent or copied (``inbox.py``).

    Batches travel through shared memory, or, with ``transport="pipe"`` or once shared memory
    proved too small for a batch under ``"auto"``, through the workers' pipes: a task names no
    slot then (``_prepare``). The fallback is the pool's decision, made once, from a worker's
    ``Shortage`` report (``_short_of_shm``); ``stats`` records it, so a later pool of the same
    loader starts on pipes."""

    def __init__(
        self,
        ctx: WorkContext,
        size: int,
        timeout: float | None,
        transport: str = "auto",
        stats: LoaderStats | None = None,
    ):
        self._policy = transport
        self._stats = stats if stats is not None else LoaderStats()
        self._by_pipe = transport == "pipe" or self._stats.transport_fallback is not None
        self._stats.transport = "pipe" if self._by_pipe else "shm"
        self._mp = process_context()
        self._token = shm.owner_token()
        self._slots = shm.ConsumerSlots()
        self._lent_counted = 0  # of self._slots.lent, in self._stats
        self._inbox = ResultInbox(self._slots)
        self._sender = TaskSender(ctx.niceness)
        super().__init__(ctx, size, timeout)  # shuts itself down if a worker fails to start

    def _new_worker(self, wid: int) -> ProcessWorker:
        try:
            worker = ProcessWorker(wid, self.ctx, self._mp, self._token, SLOTS_PER_WORKER, self._sender, self._slots)
        except shm.NoRoom as exc:
            raise SharedMemoryFull(
                f"{exc.shortage.text(f'the status slot of process worker {wid}')}: every process worker needs "
                f"one page of shared memory (under any transport). Fix: {shm.FIXES}.",
                exc.shortage.needed,
                exc.shortage.free,
                exc.shortage.total,
            ) from None
        self._inbox.watch(wid, worker.conn, worker.sentinel)
        return worker

    def _load(self, wid: int) -> tuple:
        """A worker that may lend no more batches (``shm.LENT_SLOTS`` held) comes last, since its
        next batch would be copied out of its slot, then fewer tasks, fewer slots held, the older
        last task. Going round was not enough: results come back in any order, and one of 2
        processes on HDF5 rows in order came to hold all it may lend while the other held two,
        its next task of 32 batches copied (1 to 4 such tasks every 10 epochs)."""
        held = len(self.workers[wid].held_slots())
        return (held >= shm.LENT_SLOTS, len(self.workers[wid].outstanding), held, self._last_task.get(wid, -1))

    def _prepare(self, task: BatchTask, worker: ProcessWorker) -> BatchTask:
        lend = shm.ConsumerSlots.lends and self._stats.lending_stopped is None
        return task if self._by_pipe else worker.with_free_slot(task, lend)

    def _done(self, wid: int, result: BatchResult) -> list[Event]:
        self._stats.lent_batches += self._slots.lent - self._lent_counted  # the stats outlive this pool
        self._lent_counted = self._slots.lent
        return super()._done(wid, result)

    def _short_of_shm(self, where: tuple[str, shm.Shortage]) -> None:
        """A worker found no room in shared memory for batch slot ``name`` (and sent that batch
        by pipe). A slot needed only for lending stops the lending: batches are copied out of
        the others from then on, still through shared memory."""
        name, shortage = where
        if shm.slot_index(name) >= TASKS_PER_WORKER:  # a slot beyond those of the tasks in flight
            if self._stats.lending_stopped is None:
                self._stats.lending_stopped = (
                    f"{shortage.text('a slot to lend batches from')}: batches are copied out of shared memory "
                    "instead of lent (one copy more per batch)"
                )
            return
        need = (
            f"each process worker keeps up to {TASKS_PER_WORKER} slots of its largest batch, so {self.size} "
            f"workers need about {human_bytes(TASKS_PER_WORKER * self.size * shortage.needed)}"
        )
        what = f"{shortage.text('a batch slot')} ({need})"
        if self._policy == "shm":
            raise SharedMemoryFull(
                f"{what}, and transport='shm' does not fall back to pipes. Fix: {shm.FIXES}; "
                "or pass transport='auto' to let batches travel through the workers' pipes.",
                shortage.needed,
                shortage.free,
                shortage.total,
            )
        if self._by_pipe:  # a task sent before the switch: said already
            return
        self._by_pipe = True
        message = (
            f"{what}: process workers now send batches through their pipes instead (one more copy per "
            f"batch; loader.stats()['transport'] says 'pipe'). To keep shared memory, {shm.FIXES}; "
            "transport='pipe' chooses pipes from the start, transport='shm' raises instead."
        )
        self._stats.transport, self._stats.transport_fallback = "pipe", message
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _collect(self, timeout: float) -> list[Event]:
        self._sender.check()
        return self._events(self._inbox.collect(timeout))

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._sender.stop()
            self._inbox.close()


def make_pool(
    mode: str,
    workers: int,
    ctx: WorkContext,
    timeout: float | None,
    *,
    transport: str = "auto",
    stats: LoaderStats | None = None,
):
    """The pool for ``workers`` workers of ``mode`` (no workers: :class:`InlinePool`); ``stats``
    learns the transport in use (``transport`` is process mode's, ``ExecutionOptions.transport``)."""
    stats = stats if stats is not None else LoaderStats()
    stats.transport = "ray" if workers and mode == "ray" else "in-process"
    if workers == 0:
        return InlinePool(ctx)
    if mode == "thread":
        return ThreadPool(ctx, workers, timeout)
    if mode == "process":
        return ProcessPool(ctx, workers, timeout, transport, stats)
    try:
        from .ray_pool import RayPool  # Ray is optional and slow to import: only when asked for
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"mode='ray' needs Ray: pip install 'steadyfeed[ray]' ({exc})") from exc
    return RayPool(ctx, workers, timeout)
