"""RayPool: the pool protocol of ``protocol.py`` carried out by Ray actors.

A ``pool.WorkerPool`` like the thread and process pools (the same bookkeeping of
outstanding tasks, timeouts and lost workers), so order, exactly-once delivery, retries
and the failure policy are the scheduler's, unchanged. Each actor holds the WorkContext
once (one object-store copy shared by all actors) and runs the same ``run_batch`` as every
other mode, so batches are bit-identical to thread and process mode.

Guarantees:

* at most ``TASKS_PER_WORKER`` tasks per actor (one running, one queued);
* an actor that dies (killed, crashed, its node lost) is reported as ``Lost(..., "died")``
  and replaced, naming the sample it was on. An actor on the consumer's machine writes its
  status into a shared-memory slot the consumer reads directly, as process workers do, so
  the sample is exact; an actor on another node answers a ``status()`` call, polled every
  ``STATUS_SECONDS``, so a death within one poll of starting a sample may be charged to the
  sample before it (one attempt of its ``retries``);
* a sample running past ``timeout`` is ``Lost(..., "timeout")``: the actor is killed
  (``ray.kill``) and replaced (on another node, detection lags by up to one poll, and only
  the actor's own report of its elapsed time counts, so a stale view never kills it);
* a cluster that goes away (``ray.shutdown()``, the head's node lost with the actors on it)
  raises :class:`RayClusterLost` naming its address within seconds, and actors that cannot be
  started within ``START_SECONDS`` raise it too, instead of waiting. (If only the head's GCS
  process dies while the actors live on, batches keep coming until Ray itself ends the driver
  after its GCS reconnect timeout, 60 s by default.);
* ``shutdown()`` kills every actor of this pool.
"""
from __future__ import annotations

import mmap
import os
import socket
import time
from collections import OrderedDict

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RaySystemError

from ..errors import RayClusterLost
from . import shm
from .batch import run_batch
from .pool import WorkerPool
from .protocol import Event
from .task import BatchResult, BatchTask, Running, StatusSlot, WorkContext, as_position
from .workers import portable

STATUS_SECONDS = 0.05  # how stale the consumer's view of an actor's position may get
POLL_SECONDS = 0.1  # longest single wait, so status polls and timeouts keep running
START_SECONDS = 60.0  # actors not placed by then: the cluster lacks the CPUs asked for
ACTOR_PREFIX = "steadyfeed-"
HEAD_PROBE_SECONDS = 2.0  # a head that does not accept a TCP connection by then is taken as gone
SHM_DIR = "/dev/shm"  # where POSIX shared memory appears as files on Linux
NOT_ATTACHED = -2.0  # the consumer's mark in a status slot no actor has attached to (yet)


@ray.remote(concurrency_groups={"status": 1})
class BatchActor:
    """Runs tasks one at a time (default group, max_concurrency=1); ``status`` answers from
    its own thread meanwhile, so a hung or slow sample can be seen from outside."""

    def __init__(self, ctx: WorkContext, status_name: str):
        self.ctx = ctx
        self._status_map = _attach_status(status_name)  # None on another node: status() is polled
        cells = [-1, -1, 0.0] if self._status_map is None else np.ndarray((3,), np.float64, buffer=self._status_map)
        self.slot = StatusSlot(cells)  # marks the slot attached (task id -1: idle)

    def run(self, task: BatchTask) -> BatchResult:
        return portable(run_batch(task, self.ctx, self.slot))

    @ray.method(concurrency_group="status")
    def status(self):
        """(task_id, position, seconds on it) or None when idle: seconds, since clocks differ across nodes."""
        running = self.slot.read()
        return None if running is None else (running.task_id, int(running.position), running.elapsed)

    @ray.method(concurrency_group="status")
    def pid(self) -> int:
        return os.getpid()


def _attach_status(name: str):
    """The consumer's status slot, mapped without multiprocessing's resource tracker (whose
    copy in this non-multiprocessing process would unlink the slot when the actor dies)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    except OSError:
        return None  # another machine (or no /dev/shm): fall back to polled status
    try:
        return mmap.mmap(fd, 24)
    finally:
        os.close(fd)


class _Actor:
    """One actor as a ``protocol.Worker``: its handle, its pending ``run`` calls, and its status."""

    def __init__(self, wid: int, handle, segment, pool: "RayPool"):
        self.wid, self.handle, self.segment, self._pool = wid, handle, segment, pool
        self.cells = shm.status_cells(segment)
        self.outstanding: OrderedDict[int, BatchTask] = OrderedDict()
        self.pending: dict = {}  # ObjectRef of a run call -> its task id
        self.polled: tuple | None = None  # last status() answer: (task_id, position, seconds)
        self.status_ref = None
        self.status_asked = 0.0
        self.started_ref = handle.pid.remote()  # resolves once the actor runs (or failed to start)
        self.spawned = time.monotonic()

    @property
    def attached(self) -> bool:
        return self.cells is not None and self.cells[0] != NOT_ATTACHED

    def send(self, task: BatchTask) -> None:
        self.outstanding[task.task_id] = task
        self.pending[self.handle.run.remote(task)] = task.task_id

    def running(self) -> Running | None:
        """From the shared slot on the consumer's machine; else the actor's own last answer
        (elapsed as the actor measured it: never a stale guess of ours)."""
        if self.attached:
            task_id, position, started = self.cells[0], self.cells[1], self.cells[2]
            return None if task_id < 0 else Running(int(task_id), as_position(position), time.monotonic() - started)
        if self.polled is None:
            return None
        task_id, position, elapsed = self.polled
        return Running(task_id, as_position(position), elapsed)

    def signal_stop(self) -> None:
        pass  # killing is immediate

    def stop(self) -> None:
        self.abandon()

    def abandon(self) -> None:
        if self._pool.cluster_alive():  # else the actor went with the cluster, and a call would block
            _kill(self.handle)
        self.pending.clear()
        self.cells = None  # drop the view before closing the segment
        shm.release(self.segment)


def connect() -> str:
    """The address of the Ray cluster in use, starting a local one when none is
    (``ray_init_options``: ``RAY_ADDRESS``, else a new local cluster)."""
    if not ray.is_initialized():
        ray.init(**ray_init_options())
    return ray.get_runtime_context().gcs_address


def ray_init_options(address: str | None = None, num_cpus: int | None = None, **kwargs) -> dict:
    """``ray.init`` keywords: ``address``, else ``RAY_ADDRESS`` when set, else a new local
    cluster of ``num_cpus`` CPUs (never whatever ``ray start`` last left running); no dashboard."""
    options = {"include_dashboard": False, "ignore_reinit_error": True, **kwargs}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        address, options["num_cpus"] = "local", num_cpus
    return {"address": address, **options}


class RayPool(WorkerPool):
    share_status = True  # False: every actor answers status() calls, as on a remote node (tests)

    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        self.address = connect()
        self.token = shm.owner_token()  # names our actors and status slots (the leak checks look for it)
        self._cluster_lost = False  # then no more Ray calls: they would block on the missing head
        self._ctx_ref = ray.put(ctx)  # one copy, shared by every actor and every respawn
        super().__init__(ctx, size, timeout)

    def cluster_alive(self) -> bool:
        return ray.is_initialized() and not self._cluster_lost

    # -- actors -------------------------------------------------------------------------
    def _new_worker(self, wid: int) -> _Actor:
        segment = shm.create_status(f"{self.token}r{wid}")
        shm.status_cells(segment)[0] = NOT_ATTACHED  # before the actor exists, so its mark always wins
        try:
            handle = BatchActor.options(
                name=f"{ACTOR_PREFIX}{self.token}-{wid}", num_cpus=1, max_concurrency=1,
                max_restarts=0, max_task_retries=0,  # the scheduler decides what a lost task becomes
            ).remote(self._ctx_ref, segment.name if self.share_status else "")
        except BaseException:
            shm.release(segment)
            raise
        return _Actor(wid, handle, segment, self)

    def _started(self) -> None:
        refs = [a.started_ref for a in self.workers.values()]
        ready, _ = self._guard(ray.wait, refs, num_returns=len(refs), timeout=START_SECONDS)
        for actor in self.workers.values():
            if actor.started_ref in ready:
                actor.started_ref = None
        self._check_started()

    def _check_started(self) -> None:
        """A never-placed actor would leave the epoch waiting forever: raise instead."""
        waiting = [a for a in self.workers.values() if a.started_ref is not None]
        if waiting:
            ready, _ = self._guard(ray.wait, [a.started_ref for a in waiting], num_returns=len(waiting), timeout=0)
            for actor in waiting:
                if actor.started_ref in ready:
                    actor.started_ref = None
        late = [a for a in self.workers.values() if a.started_ref is not None and time.monotonic() - a.spawned > START_SECONDS]
        if late:
            raise RayClusterLost(
                f"{len(late)} of {len(self.workers)} Ray actors did not start within {START_SECONDS:.0f}s on the "
                f"cluster at {self.address}; each needs 1 CPU ({_available_cpus()} available now). Lower workers, "
                "give the cluster more CPUs, or check that its nodes are alive.", address=self.address,
            )

    def actor_pids(self) -> list[int]:
        """Process ids of this pool's live actors (for tests and diagnostics)."""
        return self._guard(ray.get, [a.handle.pid.remote() for a in self.workers.values()], timeout=10)

    # -- the WorkerPool hooks -------------------------------------------------------------
    def _prepare(self, task: BatchTask, worker: _Actor) -> BatchTask:
        self._check_cluster()
        return task

    def _wait_interval(self, timeout: float) -> float:
        return min(timeout, POLL_SECONDS)

    def _check(self) -> list[Event]:
        self._poll_status()
        return self._expire_timeouts()

    def _before_respawn(self, cause: str) -> None:
        if cause == "died":
            self._check_head()  # actors die with their node: was it the head?

    def shutdown(self) -> None:
        super().shutdown()
        self._ctx_ref = None

    # -- results and deaths ---------------------------------------------------------------
    def _collect(self, timeout: float) -> list[Event]:
        self._check_cluster()
        owners = {ref: actor for actor in self.workers.values() for ref in actor.pending}
        if not owners:
            time.sleep(timeout)
            return []
        refs = list(owners)
        ready, _ = self._guard(ray.wait, refs, num_returns=1, timeout=timeout)
        if ready:  # take everything else that is already done too
            ready, _ = self._guard(ray.wait, refs, num_returns=len(refs), timeout=0)
        events = []
        for ref in ready:
            actor = owners[ref]
            if self.workers.get(actor.wid) is actor:  # a loss earlier in this loop may have replaced it
                events.extend(self._receive(actor, ref))
        return events

    def _receive(self, actor: _Actor, ref) -> list[Event]:
        task_id = actor.pending.pop(ref)
        try:
            result = self._guard(ray.get, ref)
        except RayActorError as exc:
            return [self._lose(actor.wid, "died", f"Ray actor died: {_first_line(exc)}")]
        except RayError as exc:  # run_batch itself raised a BaseException: like a thread worker dying
            return [self._lose(actor.wid, "died", f"Ray actor task failed: {exc}")]
        if actor.polled is not None and actor.polled[0] == task_id:
            actor.polled = None  # finished: a stale answer must not blame it later
        t0 = time.perf_counter()
        arrays = _owned(result.arrays)
        return self._done(actor.wid, result.received(arrays, time.perf_counter() - t0))

    # -- status: where each actor is, and whether it is stuck ------------------------------
    def _poll_status(self) -> None:
        self._check_started()
        now = time.monotonic()
        asked = {a.status_ref: a for a in self.workers.values() if a.status_ref is not None}
        if asked:  # one non-blocking wait for all answers: this runs once per batch
            answered, _ = self._guard(ray.wait, list(asked), num_returns=len(asked), timeout=0)
            for ref in answered:
                actor = asked[ref]
                try:
                    actor.polled = self._guard(ray.get, ref)
                except RayError:
                    pass  # the actor is dying; its run task reports that
                actor.status_ref = None
        for actor in self.workers.values():
            if actor.attached or actor.status_ref is not None or not actor.outstanding:
                continue  # a co-located actor's slot is read directly: no calls needed
            if now - actor.status_asked >= STATUS_SECONDS:
                actor.status_ref, actor.status_asked = actor.handle.status.remote(), now

    # -- the cluster itself ---------------------------------------------------------------
    def _check_cluster(self) -> None:
        # after ray.shutdown() any ray call would quietly start a new, empty local cluster
        if not ray.is_initialized():
            raise self._lost("ray.shutdown() was called")

    def _check_head(self) -> None:
        """The head's GCS port must still accept connections, else respawning would block in Ray."""
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=HEAD_PROBE_SECONDS).close()
        except (OSError, ValueError) as exc:
            raise self._lost(f"its head does not answer: {exc}") from exc

    def _lost(self, why: str) -> RayClusterLost:
        self._cluster_lost = True
        return RayClusterLost(
            f"the Ray cluster at {self.address} that this loader's {self.size} actors ran on is gone "
            f"({why}); the epoch cannot continue. Re-create the Loader after reconnecting.", address=self.address)

    def _guard(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except (RaySystemError, GetTimeoutError) as exc:
            raise self._lost(_first_line(exc)) from exc
        except ValueError as exc:  # refs of a previous session: the cluster was restarted under us
            if "owner is unknown" in str(exc):
                raise self._lost("its objects are gone") from exc
            raise


def _available_cpus():
    try:
        return ray.available_resources().get("CPU", 0)
    except Exception:  # noqa: BLE001 - only for an error message; the cluster may be gone
        return "unknown"


def _kill(handle) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except (RayError, ValueError):
        pass  # already dead


def _owned(arrays: dict | None) -> dict | None:
    """Batches must be fresh and writable: arrays read zero-copy from the object store are not."""
    if arrays is None:
        return None
    return {key: arr if arr.flags.writeable else np.array(arr, copy=True) for key, arr in arrays.items()}


def _first_line(exc: BaseException) -> str:
    """Ray's first line says what died; its last line, for a failed start, says why."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1].strip()}"
