"""Workers: the thread or process that carries out batch tasks one after another.

Both kinds are a ``protocol.Worker``: ``send(task)``, ``running()`` (read from a
:class:`StatusSlot` the worker writes), ``signal_stop()``, ``stop()``, ``abandon()``, the
``outstanding`` tasks they hold, and ``death_detail`` for the pool's message when one dies.
A thread stuck inside a hung sample cannot be killed in Python: it is abandoned (a daemon
thread, told to exit as soon as the call returns), so it blocks neither the next epoch
nor interpreter exit.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from ..errors import RemoteError
from ..sources.base import Allocator, close_source
from . import shm
from .batch import run_batch
from .task import BatchResult, BatchTask, Running, ShippedResult, StatusSlot, WorkContext, evolved

JOIN_SECONDS = 2.0
EXIT_SECONDS = 0.5  # how long a worker whose pipe closed gets to show its exit code


class ThreadWorker:
    def __init__(self, wid: int, ctx: WorkContext, outbox: queue.SimpleQueue, allocate: Allocator):
        self.wid = wid
        self.outstanding: OrderedDict[int, BatchTask] = OrderedDict()
        self.status = StatusSlot([-1, -1, 0.0])
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(ctx, outbox, allocate), name=f"steadyfeed-thread-{wid}", daemon=True
        )
        try:
            self.thread.start()
        except BaseException:  # Ctrl-C inside start(): the thread may run already, and no pool knows of it
            self.abandon()
            raise

    def _main(self, ctx: WorkContext, outbox: queue.SimpleQueue, allocate: Allocator) -> None:
        lower_priority(ctx.niceness)
        while True:
            task = self._inbox.get()
            if task is None or self._stop.is_set():
                return
            try:
                result = run_batch(task, ctx, self.status, allocate, should_stop=self._stop.is_set)
            except BaseException:  # noqa: BLE001 - reported to the consumer as a dead worker
                outbox.put(("died", self.wid, traceback.format_exc()))
                return
            if not self._stop.is_set():
                outbox.put(("done", self.wid, result))

    def send(self, task: BatchTask) -> None:
        self.outstanding[task.task_id] = task
        self._inbox.put(task)

    def running(self) -> Running | None:
        return self.status.read()

    def death_detail(self, detail: str) -> str:
        return detail  # the traceback of the BaseException that ended the thread

    def signal_stop(self) -> None:
        self.abandon()

    def abandon(self) -> None:
        """Stop waiting for this thread; it exits when (if ever) its current call returns."""
        self._stop.set()
        self._inbox.put(None)

    def stop(self) -> None:
        self.abandon()
        self.thread.join(JOIN_SECONDS)


def lower_priority(niceness: int) -> None:
    """Run the calling thread (and the threads it starts) ``niceness`` steps below the consumer.

    Workers make batches ahead of need; the training loop should never wait for the CPU (or
    for the GIL, which the OS hands to whichever waiting thread it runs first) because a
    worker is busy. Lower-priority workers use the cycles the loop leaves and yield them when
    it wants them (``benchmarks/bench_fit.py`` on 2 cores: with +5, the data wait between
    ``fit`` steps went from behind Keras ``PyDataset`` threads' to level with it, and steps ran
    faster; see docs/benchmarks.md). Linux only (per-thread nice values); raising niceness
    needs no privilege, and where it is refused (a sandbox), workers keep the consumer's.
    """
    if niceness <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except OSError:
        pass


def _process_main(conn, status_name: str, ctx: WorkContext) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle
    lower_priority(ctx.niceness)
    status_segment = shm.attach_status(status_name)
    status = StatusSlot(shm.status_cells(status_segment))
    slots = shm.WorkerSlots()
    try:
        while True:
            try:
                task = conn.recv()
            except EOFError:  # the consumer is gone
                return
            if task is None:
                return
            if task.shm_name is None:  # batches go by pipe: made in this process's memory
                shipped = ShippedResult(portable(run_batch(task, ctx, status)), None, None)
            else:
                allocate = slots.allocator(task.shm_name)
                shipped = allocate.ship(portable(run_batch(task, ctx, status, allocate=allocate)))
            # a plain pickle (arrays by protocol 5 in-band): a result holds nothing that needs
            # ForkingPickler's reducers, whose dispatch table Connection.send copies per message
            conn.send_bytes(pickle.dumps(shipped, pickle.HIGHEST_PROTOCOL))
    finally:
        del status
        status_segment.close()
        slots.close()
        close_source(ctx.source)


def portable(result: BatchResult) -> BatchResult:
    """``result`` ready to leave its process: an exception that cannot be pickled back to the
    consumer becomes a RemoteError carrying its type and message."""
    if not result.failures:
        return result
    failures = tuple(replace(f, exception=_picklable(f.exception)) for f in result.failures)
    return replace(result, failures=failures)


def _picklable(exc: BaseException | None) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RemoteError(f"{type(exc).__name__}: {exc}")


def _check_not_bootstrapping() -> None:
    """Raise, as ``Process.start()`` would, if this process is itself a spawned child still
    re-running the main module (a script without ``if __name__ == "__main__":``).

    Checked before the worker creates anything: such a child builds its own Loader, and
    if the consumer stops it in the middle of that (it shuts down a failing pool at once),
    a segment the child had created would be known to no one and outlive it.
    """
    # Private, as no public API asks "am I a spawned child re-running __main__?": this is the
    # very check Process.start() makes (3.8+). tests/test_private_apis.py fails if it goes.
    check = getattr(mp_spawn, "_check_not_importing_main", None)
    if check is not None:
        check()


class ProcessWorker:
    def __init__(
        self, wid: int, ctx: WorkContext, mpctx, token: str, slots: int, sender, consumer_slots: shm.ConsumerSlots
    ):
        self.wid = wid
        self.outstanding: OrderedDict[int, BatchTask] = OrderedDict()
        self.slot_names = [shm.slot_name(token, wid, k) for k in range(slots)]
        self._named = 0  # slot_names[:_named] have been named for a task (so exist, or failed to)
        self._sender = sender  # sender.TaskSender: writes the tasks
        self._consumer_slots = consumer_slots  # this worker's slots are unlinked there when it stops
        _check_not_bootstrapping()
        # status cells live in a tiny segment of ours (not multiprocessing's heap, whose
        # arena file stays open for the life of the interpreter)
        self._status_segment: shm.shared_memory.SharedMemory | None = None
        self.conn: Any = None  # a Connection once the pipe is made
        child = None
        try:
            self._status_segment = shm.create_status(f"{token}s{wid}")
            self.status = StatusSlot(shm.status_cells(self._status_segment))
            self.conn, child = mpctx.Pipe(duplex=True)
            self.process = mpctx.Process(
                target=_process_main,
                args=(child, self._status_segment.name, ctx),
                name=f"steadyfeed-process-{wid}",
                daemon=True,
            )
            try:
                self.process.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise TypeError(
                    "mode='process' pickles the source and the transform into each worker; "
                    f"this one cannot be pickled ({exc}). Define it at module level, or use mode='thread'."
                ) from exc
            self._pipe = sender.pipe_for(self.conn)
        except BaseException:
            # Whatever stops the start (an unpicklable source; the bootstrapping RuntimeError
            # of a script without a __main__ guard, re-run inside a spawned child; Ctrl-C; no
            # fds left), no one else knows this segment: unlink it here, or it stays in
            # /dev/shm until the resource tracker sweeps it at exit, warning of a leak.
            if self.conn is not None:
                self.conn.close()
            self._release_status()
            raise
        finally:
            if child is not None:
                child.close()

    @property
    def sentinel(self):
        return self.process.sentinel

    def held_slots(self) -> set[str]:
        """This worker's slots that the consumer holds: a lent batch is alive in each, or a task
        sent is to write one to be lent (``shm.ConsumerSlots``)."""
        return self._consumer_slots.held(self.slot_names)

    def with_free_slot(self, task: BatchTask, lend: bool) -> BatchTask:
        """``task`` writing into a slot of this worker's that no outstanding task names and no
        lent batch holds. Its batch is to be lent (``shm.ConsumerSlots``) when ``lend`` and fewer
        than ``shm.LENT_SLOTS`` of these slots are held, else copied out; ``slots`` (at least
        ``shm.LENT_SLOTS`` more than the tasks a worker has at once) leaves a free one either way."""
        held = self.held_slots()
        busy = held.union(t.shm_name for t in self.outstanding.values())
        # slots never named yet come first: a worker's first tasks make all of its slots, so how
        # many it has (in /dev/shm) never depends on how many batches the consumer happens to hold
        order = self.slot_names[self._named :] + self.slot_names[: self._named]
        name = next(name for name in order if name not in busy)
        self._named += name == order[0] and self._named < len(self.slot_names)
        if lend and len(held) < shm.LENT_SLOTS:
            self._consumer_slots.hold(name, task.batches)
        return evolved(task, shm_name=name)

    def send(self, task: BatchTask) -> None:
        self.outstanding[task.task_id] = task
        self._sender.send(self._pipe, task)

    def running(self) -> Running | None:
        return self.status.read()

    def death_detail(self, detail: str) -> str:
        """The exit code, when the process shows it: the pipe may close a moment before."""
        if self.process.exitcode is None:
            self.process.join(EXIT_SECONDS)
        code = self.process.exitcode
        return detail if code is None else f"worker process exited with code {code}{_signal_name(code)}"

    def signal_stop(self) -> None:
        """Ask the worker to exit when its current task is done, without waiting: a worker busy
        writing a result no one reads any more may never read its pipe (``stop`` ends it anyway)."""
        try:
            os.set_blocking(self.conn.fileno(), False)
            self.conn.send(None)
        except (OSError, ValueError):
            pass

    def abandon(self) -> None:
        try:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(JOIN_SECONDS)
        except ValueError:  # closed already, by a release that a Ctrl-C interrupted (_release)
            pass
        self._release()

    def stop(self) -> None:
        self.signal_stop()
        self.process.join(0.5 if not self.outstanding else 0.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(JOIN_SECONDS)
        self.abandon()

    def _release(self) -> None:
        """Frees what this worker holds. Every step may run again: a Ctrl-C inside one call (a
        second press while stopping, which the pool folds into the first) leaves the rest to the
        ``abandon()`` that follows it (which, when it returned on finding the pipe closed, left
        this worker's status segment in /dev/shm)."""
        if not self.conn.closed:
            self._sender.forget(self._pipe)
            self.conn.close()
        try:
            if self.process.exitcode is not None:
                self.process.close()
        except ValueError:  # closed already, by the call that was interrupted
            pass
        self._release_status()
        self._consumer_slots.discard(self.slot_names)

    def _release_status(self) -> None:
        if self._status_segment is not None:
            self.status = StatusSlot([-1, -1, 0.0])  # drop the view before closing the segment
            shm.release(self._status_segment)
            self._status_segment = None


def _signal_name(exitcode: int) -> str:
    """`` (SIGKILL)`` for a process a signal ended (a negative exit code), else nothing."""
    try:
        return f" ({signal.Signals(-exitcode).name})" if exitcode < 0 else ""
    except ValueError:
        return ""


def process_context():
    """Spawn: never fork a parent that may hold framework threads, locks or GPU contexts."""
    return mp.get_context("spawn")
