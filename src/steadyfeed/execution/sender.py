"""Process mode: tasks, pickled in the consumer's thread and written to the workers.

A task names its batch's sample ids and little else: with batches of up to a few thousand
samples its pickle is a few kilobytes, written straight into the worker's pipe from the
consumer's thread (~20 us). Such a write cannot block: a worker holds at most
``TASKS_PER_WORKER`` tasks, so its pipe never holds more than that many unread, far below
what the socket buffers. A bigger task (a batch of a hundred thousand rows names as many ids)
could fill the pipe while the worker is busy with its current batch, and the consumer must
never wait for a worker to read: such tasks, and every later task to the same worker (so that
none overtakes another), go through a thread that writes them, started the first time one does.

Guarantees:

* each worker gets its tasks in the order the consumer sent them;
* a task that does not pickle raises in the consumer's thread, where it was sent;
* a worker that died meanwhile makes the write fail quietly: the pool learns of the death
  from its sentinel (``inbox.py``) and re-runs the task elsewhere;
* the thread writes through its own duplicate of each worker's pipe, closed only when the
  consumer says so (``forget``, queued behind that worker's last task), so the consumer
  closing its handle never races a write there; any other failure of the thread reaches the
  consumer as a ``RuntimeError`` from ``check`` instead of a hang.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import traceback
from multiprocessing.connection import Connection

from .task import BatchTask
from .workers import JOIN_SECONDS, lower_priority

DIRECT_BYTES = 64 * 1024  # the largest task written from the consumer's thread


class TaskSender:
    def __init__(self, niceness: int):
        self._niceness = niceness
        self._queued: set[Connection] = set()  # the pipes whose tasks go through the thread
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._crashed: str | None = None  # the thread's traceback, if it failed

    def pipe_for(self, conn: Connection) -> Connection:
        """A handle on ``conn``'s pipe of the sender's own, to pass to ``send`` and ``forget``."""
        return Connection(os.dup(conn.fileno()))

    def send(self, pipe: Connection, task: BatchTask) -> None:
        # a plain pickle: a task holds nothing that needs ForkingPickler's reducers, and the
        # worker's Connection.recv reads any pickle
        payload = pickle.dumps(task, pickle.HIGHEST_PROTOCOL)
        if pipe not in self._queued and len(payload) <= DIRECT_BYTES:
            try:
                pipe.send_bytes(payload)
            except OSError:
                pass  # the worker died: its sentinel says so, and the task runs elsewhere
            return
        self._queued.add(pipe)
        self._start()
        self._queue.put((pipe, payload))

    def forget(self, pipe: Connection) -> None:
        """Close ``pipe`` once the tasks sent to it before are written (or have failed); at once
        where the thread that writes them has ended (a worker released after ``stop``, by a
        shutdown that a Ctrl-C had cut short: ``pool.py``), as nothing queued would be written."""
        if pipe in self._queued and self._thread is not None and self._thread.is_alive():
            self._queued.discard(pipe)
            self._queue.put((pipe, None))
        else:
            pipe.close()

    def check(self) -> None:
        """Raise if the thread failed (a bug): its tasks were never written."""
        if self._crashed is not None:
            raise RuntimeError(f"steadyfeed bug: the thread that writes tasks to the workers failed:\n{self._crashed}")

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)  # the thread writes what was queued before, then ends
            self._thread.join(JOIN_SECONDS)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="steadyfeed-sender", daemon=True)
            self._thread.start()

    def _main(self) -> None:
        lower_priority(self._niceness)
        try:
            while (item := self._queue.get()) is not None:
                pipe, payload = item
                if payload is None:
                    pipe.close()
                    continue
                try:
                    pipe.send_bytes(payload)
                except OSError:
                    pass  # the worker died: its sentinel says so, and the task runs elsewhere
        except BaseException:  # noqa: BLE001 - a bug here must reach the consumer, not hang it
            self._crashed = traceback.format_exc()
