"""The pool: hands tasks to workers and turns what happens to them into events.

Events are ``Done(result)`` and ``Lost(tasks, running, cause, detail)``. A worker
is *lost* when it dies (a process killed by a signal, a thread hit by a
``BaseException``) or when the sample it is on runs past ``timeout``; the pool then
replaces it, and the consumer decides what the lost tasks become (``loader.py``).
Death is seen at once through process sentinels; timeouts within a poll interval.
"""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from . import shm
from .batch import run_batch
from .receiver import ResultReceiver
from .sender import TaskSender
from .task import BatchResult, BatchTask, StatusSlot, WorkContext
from .workers import ProcessWorker, ThreadWorker, process_context

TASKS_PER_WORKER = 2  # one running, one queued behind it, so no worker idles between tasks
EXIT_SECONDS = 0.5  # how long a worker whose pipe closed gets to show its exit code


@dataclass
class Done:
    result: BatchResult


@dataclass
class Lost:
    tasks: list[BatchTask]  # every task the worker held, in the order it got them
    running: tuple[int, int] | None  # (task_id, position) it was on when lost, if inside a task
    cause: str  # "died" or "timeout"
    detail: str


class InlinePool:
    """workers=0: no workers; the consumer makes every batch with ``run_here``."""

    def __init__(self, ctx: WorkContext):
        self.ctx = ctx
        self._status = StatusSlot([-1, -1, 0.0])

    def free_slots(self) -> int:
        return 0

    def run_here(self, task: BatchTask) -> BatchResult:
        """Make the batch in the consumer's own thread (never interrupted: no timeout applies)."""
        return run_batch(task, self.ctx, self._status)

    def drain(self) -> list:
        return []

    def wait(self, timeout: float) -> list:
        raise RuntimeError("steadyfeed bug: waited on a pool without workers")  # a spin would be a hang

    def shutdown(self) -> None:
        pass


class _WorkerPool(InlinePool):
    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        super().__init__(ctx)
        self.size, self.timeout = size, timeout
        self.workers: dict = {}
        self._next_wid = 0
        try:
            for _ in range(size):
                self._spawn()
        except BaseException:
            self.shutdown()  # a worker that failed to start must not strand the ones that did
            raise

    def _spawn(self):
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        self.workers[wid] = self._new_worker(wid)

    def free_slots(self) -> int:
        return sum(TASKS_PER_WORKER - len(w.outstanding) for w in self.workers.values())

    def submit(self, task: BatchTask) -> None:
        worker = min(self.workers.values(), key=lambda w: len(w.outstanding))
        self._prepare(task, worker)
        worker.send(task)

    def _prepare(self, task: BatchTask, worker) -> None:
        pass

    def wait(self, timeout: float) -> list:
        poll = timeout if self.timeout is None else min(timeout, max(self.timeout / 4, 0.01))
        events = self._collect(poll)
        events.extend(self._expire_timeouts())
        return events

    def drain(self) -> list:
        """Events that already happened, without blocking."""
        return self._collect(0) + self._expire_timeouts()

    def _lose(self, wid: int, cause: str, detail: str) -> Lost:
        worker = self.workers.pop(wid)
        running = worker.status.read()
        worker.abandon()
        self._after_stop(worker)
        self._spawn()
        tasks = list(worker.outstanding.values())
        return Lost(tasks, running[:2] if running else None, cause, detail)

    def _after_stop(self, worker) -> None:
        pass

    def _expire_timeouts(self) -> list:
        if self.timeout is None:
            return []
        now, lost = time.monotonic(), []
        for wid, worker in list(self.workers.items()):
            running = worker.status.read()
            if running is not None and running[1] >= 0 and now - running[2] > self.timeout:
                lost.append(self._lose(wid, "timeout", f"ran past timeout={self.timeout}s"))
        return lost

    def shutdown(self) -> None:
        workers, self.workers = list(self.workers.values()), {}
        for worker in workers:  # tell every thread first, so they stop in parallel
            if worker.kind == "thread":
                worker.abandon()
        for worker in workers:
            worker.stop()
            self._after_stop(worker)


class _OutboxPool(_WorkerPool):
    """Workers whose news arrives on one queue, ``self._outbox`` (made by the subclass before
    its workers start): ``("done", wid, result)``, ``("died", wid, detail)``. Waiting for
    news is one blocking ``get``, not a poll."""

    _outbox: queue.SimpleQueue

    def _collect(self, timeout: float) -> list:
        if timeout <= 0 and self._outbox.empty():
            return []  # the common case of drain(): nothing new, no exception raised and caught
        events = []
        try:
            message = self._outbox.get(timeout=timeout)
            while True:
                events.extend(self._handle(*message))
                message = self._outbox.get_nowait()
        except queue.Empty:
            return events

    def _handle(self, kind: str, wid: int, payload) -> list:
        if kind == "crashed":
            raise RuntimeError(f"steadyfeed bug: a thread of the pool that sends tasks or receives results "
                               f"failed:\n{payload}")
        worker = self.workers.get(wid)
        if worker is None:  # an abandoned worker finished late: its tasks were already re-run
            return []
        if kind == "died":
            return [self._lose(wid, "died", self._death_detail(worker, payload))]
        worker.outstanding.pop(payload.task_id, None)
        return [Done(payload)]

    def _death_detail(self, worker, detail: str) -> str:
        return detail


class ThreadPool(_OutboxPool):
    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        self._outbox = queue.SimpleQueue()
        super().__init__(ctx, size, timeout)

    def _new_worker(self, wid: int) -> ThreadWorker:
        return ThreadWorker(wid, self.ctx, self._outbox)


class ProcessPool(_OutboxPool):
    """Worker processes. Two threads keep the pipes off the consumer's thread (the training
    loop): a sender writes the tasks (``sender.py``), a receiver takes the results in and
    copies each batch out of shared memory before the consumer asks for it (``receiver.py``)."""

    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        self._mp = process_context()
        self._token = shm.owner_token()
        self._slots = shm.ConsumerSlots()
        self._outbox = queue.SimpleQueue()
        self._receiver = ResultReceiver(self._slots, self._outbox, ctx.niceness)
        self._sender = TaskSender(self._outbox, ctx.niceness)
        super().__init__(ctx, size, timeout)

    def _new_worker(self, wid: int) -> ProcessWorker:
        worker = ProcessWorker(wid, self.ctx, self._mp, self._token, TASKS_PER_WORKER, self._sender)
        self._receiver.watch(wid, worker.conn, worker.sentinel)
        return worker

    def _prepare(self, task: BatchTask, worker: ProcessWorker) -> None:
        task.shm_name = worker.free_slot_name()

    def _death_detail(self, worker: ProcessWorker, detail: str) -> str:
        if worker.process.exitcode is None:  # its pipe closed a moment before its exit shows
            worker.process.join(EXIT_SECONDS)
        code = worker.process.exitcode
        return detail if code is None else f"worker process exited with code {code}"

    def _after_stop(self, worker: ProcessWorker) -> None:
        self._slots.discard(worker.slot_names)

    def shutdown(self) -> None:
        super().shutdown()
        self._sender.stop()
        self._receiver.stop()


def make_pool(mode: str, workers: int, ctx: WorkContext, timeout: float | None):
    if workers == 0:
        return InlinePool(ctx)
    if mode == "thread":
        return ThreadPool(ctx, workers, timeout)
    if mode == "ray":
        try:
            from .ray_pool import RayPool  # Ray is optional and slow to import: only when asked for
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"mode='ray' needs Ray: pip install 'steadyfeed[ray]' ({exc})") from exc
        return RayPool(ctx, workers, timeout)
    return ProcessPool(ctx, workers, timeout)
