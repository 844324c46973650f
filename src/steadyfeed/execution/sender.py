"""Process mode: a thread of the consumer's that pickles tasks and writes them to the workers.

Handing a task to a worker process costs a pickle and a pipe write that wakes the worker:
~100 us in ``fit`` (``benchmarks/bench_fit.py``), between two training steps. The consumer's
thread only queues the task here; this thread sends it.

Guarantees:

* each worker gets its tasks in the order the consumer queued them;
* it writes through its own duplicate of each worker's pipe, which it closes only when the
  consumer says so (``forget``, queued behind that worker's last task): the consumer closing
  its handle never races a write here, and no write can land on a reused fd number;
* a worker that died meanwhile makes the write fail quietly: the pool learns of the death
  from the receiver (``receiver.py``) and re-runs the task elsewhere;
* any other failure (a task that does not pickle: a bug) reaches the pool's outbox as
  ``("crashed", -1, traceback)``, so the consumer never waits for a task that was never sent.
"""

from __future__ import annotations

import os
import queue
import threading
import traceback
from multiprocessing.connection import Connection

from .task import BatchTask
from .workers import JOIN_SECONDS, lower_priority


class TaskSender:
    def __init__(self, outbox: queue.SimpleQueue, niceness: int):
        self._outbox, self._niceness = outbox, niceness
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="steadyfeed-sender", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # Ctrl-C inside start(): the thread may run already, and no pool knows of it
            self._queue.put(None)
            raise

    def pipe_for(self, conn: Connection) -> Connection:
        """This thread's own handle on ``conn``'s pipe, to pass to ``send`` and ``forget``."""
        return Connection(os.dup(conn.fileno()))

    def send(self, pipe: Connection, task: BatchTask) -> None:
        self._queue.put((pipe, task))

    def forget(self, pipe: Connection) -> None:
        """Close ``pipe`` once the tasks queued for it before are written (or have failed)."""
        self._queue.put((pipe, None))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(JOIN_SECONDS)

    def _main(self) -> None:
        lower_priority(self._niceness)
        try:
            while (item := self._queue.get()) is not None:
                pipe, task = item
                if task is None:
                    pipe.close()
                    continue
                try:
                    pipe.send(task)
                except OSError:
                    pass  # the worker died: the receiver reports it, and the task runs elsewhere
        except BaseException:  # noqa: BLE001 - a bug here must reach the consumer, not hang it
            self._outbox.put(("crashed", -1, traceback.format_exc()))
