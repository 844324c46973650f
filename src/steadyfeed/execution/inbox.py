"""Process mode: the workers' results, taken off their pipes in the consumer's own thread.

The consumer reads the pipes when it waits for a batch or drains news between two batches
(``ProcessPool._collect``): one ``select`` over every worker's pipe and process sentinel.
Nothing else runs per batch: a result is a small pickle, and its batch is lent as views of
the worker's slot (``shm.ConsumerSlots``), so there is no copy to hide. A thread of its own
cost more than it hid: each batch woke it and handed it over to the consumer's thread through
the GIL, and on 2 cores shared with two workers that hop limited the whole pipeline (npy
pairs: 47k pairs/s through a receiver thread, 59k in the consumer's thread, same run).

Guarantees:

* ``collect`` returns what the workers sent, each worker's in order, as ``("done", wid,
  result)`` with the batch already out of its slot (lent or copied: ``shm.ConsumerSlots``;
  or as it came, by pipe), preceded by ``("short", wid, (slot name, shm.Shortage))`` when
  shared memory had no room for its slot; a worker's end (its pipe closing, its process
  exiting) as one ``("died", wid, detail)``, after every whole result it sent before it;
* it reads its own duplicates of each worker's pipe and sentinel, and closes them when it
  sees that worker end (or at ``close``): the pool closing a lost worker's handles never
  leaves a closed descriptor registered here, and a "died" for a worker the pool already
  replaced is simply ignored there.
"""

from __future__ import annotations

import os
import pickle
import selectors
import time
from multiprocessing.connection import Connection

from . import shm
from .task import BatchResult, ShippedResult

Message = tuple[str, int, object]


class ResultInbox:
    def __init__(self, slots: shm.ConsumerSlots):
        self._slots = slots
        self._selector = selectors.DefaultSelector()
        self._watching: dict[int, tuple[Connection, int]] = {}  # wid -> (its pipe, its sentinel), duplicated

    def watch(self, wid: int, conn: Connection, sentinel: int) -> None:
        """Take results from worker ``wid`` from now on."""
        pipe, ended = Connection(os.dup(conn.fileno())), os.dup(sentinel)
        self._watching[wid] = (pipe, ended)
        self._selector.register(pipe.fileno(), selectors.EVENT_READ, (wid, "pipe"))
        self._selector.register(ended, selectors.EVENT_READ, (wid, "ended"))

    def collect(self, timeout: float) -> list[Message]:
        """What the workers sent, waiting up to ``timeout`` seconds for something (0: only what
        is there already): one message from each pipe that has one. A pipe holding more is
        ready again at the next call, which the consumer makes before it waits or hands a
        batch over; a second select here, to empty it now, cost more than it found."""
        messages: list[Message] = []
        for key, _ in self._selector.select(timeout):
            wid, kind = key.data
            self._ready(wid, kind, messages)
        return messages

    def close(self) -> None:
        for wid in list(self._watching):
            self._forget(wid)
        self._selector.close()

    def _ready(self, wid: int, kind: str, messages: list[Message]) -> None:
        if wid not in self._watching:  # ended earlier in this round: its other handle is stale
            return
        if kind == "ended":
            # what it sent before it exited comes first: a result already written is kept, not
            # re-run, whichever of the pipe and the sentinel the select listed first
            pipe = self._watching[wid][0]
            while wid in self._watching and pipe.poll(0):
                self._take_in(wid, pipe, messages)
            if wid in self._watching:
                self._end(wid, "worker process exited", messages)
            return
        self._take_in(wid, self._watching[wid][0], messages)  # one message: the next select sees the rest

    def _take_in(self, wid: int, pipe: Connection, messages: list[Message]) -> None:
        """Read one message off worker ``wid``'s pipe into ``messages``, or its end."""
        try:
            shipped = pipe.recv()
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            self._end(wid, f"worker pipe closed ({type(exc).__name__})", messages)
            return
        if shipped.shortage is not None:  # before its batch: the pool decides what follows first
            messages.append(("short", wid, (shipped.shm_name, shipped.shortage)))
        try:
            messages.append(("done", wid, self._take_out(shipped)))
        except (OSError, ValueError) as exc:  # its slot gone: the worker was lost meanwhile
            self._end(wid, f"worker's batch slot gone ({type(exc).__name__})", messages)

    def _take_out(self, shipped: ShippedResult) -> BatchResult:
        """The result with its batch taken out of its shared-memory slot (``ConsumerSlots.receive``:
        lent or copied)."""
        if shipped.shm_name is None:
            return shipped.result
        t0 = time.perf_counter()
        arrays = self._slots.receive(shipped.shm_name, shipped.layout, shipped.generation)
        if shipped.layout is None:  # not in the slot
            return shipped.result
        return shipped.result.received(arrays, time.perf_counter() - t0)

    def _end(self, wid: int, detail: str, messages: list[Message]) -> None:
        self._forget(wid)
        messages.append(("died", wid, detail))

    def _forget(self, wid: int) -> None:
        pipe, ended = self._watching.pop(wid)
        self._selector.unregister(pipe.fileno())
        self._selector.unregister(ended)
        pipe.close()
        os.close(ended)
