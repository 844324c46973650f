"""Process mode: a thread of the consumer's that takes results off the workers' pipes as they come.

The consumer's own thread is the training loop: between two steps it should find the next
batch ready, not receive it. Unpickling a result and taking its batch out of shared memory
(views of the slot when it is lent; a copy, ~200 us per batch in ``fit``, when it is not, see
``shm.py``) run here while the step does (numpy's copy releases the GIL), in a thread as far
below the consumer's CPU priority as the workers.

Guarantees:

* what each worker sends reaches the pool's outbox in order, as ``("done", wid, result)``
  with the batch already out of its slot (lent or copied: ``shm.ConsumerSlots``; or as it
  came, by pipe), preceded by ``("short", wid, (slot name, shm.Shortage))`` when shared memory
  had no room for its slot; a worker's end (its pipe closing, its
  process exiting) as one ``("died", wid, detail)``; a failure of this thread itself as
  ``("crashed", -1, traceback)``, so the consumer never waits on a thread that is gone;
* it reads its own duplicates of each worker's pipe and process sentinel: the consumer
  closing its handles (a lost or stopped worker) never races a read here;
* taking a batch out runs under the slots' lock (``shm.ConsumerSlots``), so the consumer
  unlinking a dead worker's slots never pulls a segment from under it.
"""

from __future__ import annotations

import os
import pickle
import queue
import selectors
import threading
import time
import traceback
from multiprocessing.connection import Connection

from . import shm
from .task import BatchResult, ShippedResult
from .workers import JOIN_SECONDS, lower_priority


class ResultReceiver:
    def __init__(self, slots: shm.ConsumerSlots, outbox: queue.SimpleQueue, niceness: int):
        self._slots, self._outbox, self._niceness = slots, outbox, niceness
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._watching: dict[int, tuple[Connection, int]] = {}  # wid -> (its pipe, its sentinel), duplicated
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="steadyfeed-receiver", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # Ctrl-C inside start(): the thread may run already, and no pool knows of it
            self.stop()
            raise

    def watch(self, wid: int, conn: Connection, sentinel: int) -> None:
        """Receive from worker ``wid`` from now on. Called by the consumer: epoll takes new
        fds while this thread waits, and only this thread ever unregisters them."""
        pipe, ended = Connection(os.dup(conn.fileno())), os.dup(sentinel)
        self._watching[wid] = (pipe, ended)
        self._selector.register(pipe.fileno(), selectors.EVENT_READ, (wid, "pipe"))
        self._selector.register(ended, selectors.EVENT_READ, (wid, "ended"))

    def stop(self) -> None:
        """End the thread (after the workers have stopped) and close what it held."""
        self._stopping = True
        os.write(self._wake_write, b"x")
        if self._thread.ident is None:  # never ran (its start failed): nothing closed the selector
            self._selector.close()
        else:
            self._thread.join(JOIN_SECONDS)
        if not self._thread.is_alive():  # else it still holds them: leave them to exit
            os.close(self._wake_read)
            os.close(self._wake_write)

    # -- the thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        lower_priority(self._niceness)
        try:
            while not self._stopping:
                for key, _ in self._selector.select():
                    if key.data is not None:
                        self._ready(*key.data)
        except BaseException:  # noqa: BLE001 - a bug here must reach the consumer, not hang it
            self._outbox.put(("crashed", -1, traceback.format_exc()))
        finally:
            for wid in list(self._watching):
                self._forget(wid)
            self._selector.close()

    def _ready(self, wid: int, kind: str) -> None:
        if wid not in self._watching:  # ended earlier in this round: its other handle is stale
            return
        if kind == "ended":
            self._end(wid, "worker process exited")
            return
        pipe = self._watching[wid][0]
        try:
            while pipe.poll():
                shipped = pipe.recv()
                if shipped.shortage is not None:  # before its batch: the pool decides what follows first
                    self._outbox.put(("short", wid, (shipped.shm_name, shipped.shortage)))
                self._outbox.put(("done", wid, self._copy_out(shipped)))
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:  # a slot gone too: the worker was lost
            self._end(wid, f"worker pipe closed ({type(exc).__name__})")

    def _copy_out(self, shipped: ShippedResult) -> BatchResult:
        """The result with its batch taken out of its shared-memory slot (``ConsumerSlots.receive``:
        lent or copied)."""
        if shipped.shm_name is None:
            return shipped.result
        t0 = time.perf_counter()
        arrays = self._slots.receive(shipped.shm_name, shipped.layout)
        if shipped.layout is None:  # not in the slot
            return shipped.result
        return shipped.result.received(arrays, time.perf_counter() - t0)

    def _end(self, wid: int, detail: str) -> None:
        self._forget(wid)
        self._outbox.put(("died", wid, detail))

    def _forget(self, wid: int) -> None:
        pipe, ended = self._watching.pop(wid)
        self._selector.unregister(pipe.fileno())
        self._selector.unregister(ended)
        pipe.close()
        os.close(ended)
