"""RayPool: the pool protocol of ``protocol.py`` carried out by Ray actors.

A ``pool.WorkerPool`` like the thread and process pools (the same bookkeeping of
outstanding tasks, timeouts and lost workers), so order, exactly-once delivery, retries
and the failure policy are the scheduler's, unchanged. Each actor holds the WorkContext
once (one object-store copy shared by all actors) and runs the same ``run_batch`` as every
other mode, so batches are bit-identical to thread and process mode.

Guarantees:

* at most ``TASKS_PER_WORKER`` tasks per actor (one running, one queued), and tasks go only
  to actors that have started: actors start in the background, and one placed late (or a
  replacement) joins when it runs, never holding a batch while it waits for a CPU;
* an actor that dies (killed, crashed, its node lost) is reported as ``Lost(..., "died")`` at
  once and replaced in the background, so its batches re-run on the actors still running and
  the epoch goes on at reduced parallelism. Who is charged (``_last_status``):

  - its node still up: the sample the actor itself last recorded as running. Each actor
    writes its status into a shared-memory slot before every sample: on the consumer's node
    the consumer's own slot, read directly; on any other node a slot in that node's
    ``/dev/shm``, which outlives the actor and which this pool's agent on that node
    (``NodeAgent``, no CPU) reads after the death. So the sample is exact whatever the timing;
  - its node lost (the cluster lists it as dead, or its raylet does not accept a connection):
    no sample, since the node went, not the sample; the tasks re-run uncharged (the
    scheduler bounds deaths that charge no sample);

* ``RayClusterLost`` (naming the address) when no actor of the pool has been running for
  ``START_SECONDS`` (none could be placed, or all were lost and no replacement could be), or
  when the head is gone (its GCS port is checked on every death). An actor still waiting
  after ``START_SECONDS`` while others run is named once in a ``RuntimeWarning``. (If only
  the head's GCS process dies while the actors live on, batches keep coming until Ray itself
  ends the driver after its GCS reconnect timeout, 60 s by default.);
* a sample running past ``timeout`` is ``Lost(..., "timeout")``: the actor is killed
  (``ray.kill``) and replaced (off the consumer's node, detection lags by up to one
  ``status()`` poll, and only the actor's own report of its elapsed time counts, so a stale
  view never kills it);
* ``shutdown()`` kills every actor and agent of this pool and removes its status slots. An
  actor killed while it was still starting may run its ``started`` call after the removal (a
  loaded machine: 4 ms after); on the consumer's own ``/dev/shm`` it finds the consumer's slot
  gone and makes none of its own, since one made then would outlive the pool;
* a full ``/dev/shm`` never kills an actor with SIGBUS: every status slot's page is reserved
  when it is made (``shm.reserve``). Where the consumer's slot does not fit, its actors keep
  their own, as remote ones do (one ``RuntimeWarning``); where an actor's own does not fit
  either, it keeps none, and its death charges no sample. Batches travel through Ray's object
  store, which Ray places and sizes itself when the cluster starts (README, "Hostile machines").
"""

from __future__ import annotations

import mmap
import os
import socket
import time
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RaySystemError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import RayClusterLost
from . import shm
from .batch import run_batch
from .pool import TASKS_PER_WORKER, WorkerPool
from .protocol import Event, Lost
from .task import BatchResult, BatchTask, Running, StatusSlot, WorkContext, as_position
from .workers import portable

STATUS_SECONDS = 0.05  # how stale the consumer's view of a remote actor's position may get (timeouts)
POLL_SECONDS = 0.1  # longest single wait, so placements, status polls and timeouts keep running
START_SECONDS = 60.0  # no actor running for this long: the cluster lacks the CPUs asked for, or its nodes
AGENT_SECONDS = 30.0  # longest wait for a node agent's answer (it may still be starting)
SWEEP_SECONDS = 5.0  # longest wait, at shutdown, for the agents to remove the status slots
KILL_SECONDS = 30.0  # longest wait, at shutdown, for killed actors' pending start-up answers
ACTOR_PREFIX = "steadyfeed-"
# what each actor asks of the cluster (tests add resources to pin a node)
ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1}
HEAD_PROBE_SECONDS = 2.0  # a head or raylet that does not accept a TCP connection by then is taken as gone
SHM_DIR = "/dev/shm"  # where POSIX shared memory appears as files on Linux
SLOT_BYTES = 24  # a StatusSlot: three float64 cells


@ray.remote(concurrency_groups={"status": 1})  # type: ignore[call-overload]  # in Ray's API, not in its stubs
class BatchActor:
    """Runs tasks one at a time (default group, max_concurrency=1); ``status`` answers from
    its own thread meanwhile, so a hung or slow sample can be seen from outside."""

    def __init__(self, ctx: WorkContext, shared_slot: str, consumer_node: str, own_slot: str, consumer_shm: str | None):
        self.ctx = ctx
        self.node_id = ray.get_runtime_context().get_node_id()
        self._slots: tuple | None = (shared_slot, consumer_node, own_slot, consumer_shm)
        self._map = None
        self.kept: str | None = None
        self.slot = StatusSlot([-1, -1, 0.0])  # none until started(): tasks come only after it

    def _open_slot(self) -> None:
        """The status slot, idle (task id -1) before anything reads it: the consumer's on the
        consumer's node (a second node on the same machine sees the same /dev/shm, but is
        another node: it keeps its own slot, as a remote one), else one of its own.
        Made in ``started`` rather than ``__init__``: Ray can cancel an actor's creation while
        ``__init__`` runs, so a slot made there could appear after the pool swept its slots;
        ``started`` runs only on an actor that is alive."""
        assert self._slots is not None  # opened once
        (shared_slot, consumer_node, own_slot, consumer_shm), self._slots = self._slots, None
        on_consumer_node = bool(shared_slot) and self.node_id == consumer_node
        self._map = _map_slot(shared_slot) if on_consumer_node else None
        self.kept = "shared" if self._map is not None else None
        if self._map is None and on_consumer_node and consumer_shm is not None and consumer_shm == shm_identity():
            # the consumer's slot is gone from the very /dev/shm it was made in: the pool let
            # this actor go (it is being killed), and a slot made now would outlive its sweep
            return
        if self._map is None:
            self._map = _create_slot(own_slot)  # None without /dev/shm: deaths then charge no sample
            self.kept = None if self._map is None else own_slot
        if self._map is not None:
            self.slot = StatusSlot(np.ndarray((3,), np.float64, buffer=self._map))

    def run(self, task: BatchTask) -> BatchResult:
        return portable(run_batch(task, self.ctx, self.slot))

    @ray.method(concurrency_group="status")
    def started(self) -> tuple:
        """(pid, node id, where the status is kept: "shared", the own slot's name, or None)."""
        if self._slots is not None:
            self._open_slot()
        return os.getpid(), self.node_id, self.kept

    @ray.method(concurrency_group="status")
    def status(self):
        """(task_id, position, seconds on it) or None when idle: seconds, since clocks differ across nodes."""
        running = self.slot.read()
        return None if running is None else (running.task_id, int(running.position), running.elapsed)

    @ray.method(concurrency_group="status")
    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0, max_restarts=0)
class NodeAgent:
    """This pool's helper on one node with actors that keep their own status slots: reads the
    slot a dead actor left behind, and removes the pool's slots at the end."""

    def last_status(self, name: str):
        """The three cells the actor last wrote (then the slot is removed), or None if it has none."""
        path = os.path.join(SHM_DIR, name)
        try:
            with open(path, "rb") as f:
                cells = np.frombuffer(f.read(SLOT_BYTES), np.float64)
        except OSError:
            return None
        _unlink(path)
        return tuple(float(c) for c in cells) if len(cells) == 3 else None

    def sweep(self, prefix: str) -> int:
        return _sweep(prefix)


def shm_identity() -> str | None:
    """Which ``/dev/shm`` this process sees: the kernel's boot id and the mount's device and
    inode, equal only for two processes on one machine sharing that mount; None where there is
    no such thing to compare (no ``/proc`` boot id, no ``/dev/shm``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        st = os.stat(SHM_DIR)
    except OSError:
        return None
    return f"{boot}:{st.st_dev}:{st.st_ino}"


def _map_slot(name: str):
    """The consumer's status slot, mapped without multiprocessing's resource tracker (whose
    copy in this non-multiprocessing process would unlink the slot when the actor dies)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    except OSError:
        return None  # not the consumer's machine after all (Ray Client): keep an own slot
    try:
        return mmap.mmap(fd, SLOT_BYTES)
    finally:
        os.close(fd)


def _create_slot(name: str):
    """A slot of the actor's own that outlives it (no resource tracker either), for the agent to
    read; None where /dev/shm is missing or full (its page reserved now, so a write to it can
    never be a SIGBUS)."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.ftruncate(fd, SLOT_BYTES)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, SLOT_BYTES)
        return mmap.mmap(fd, SLOT_BYTES)
    except OSError:
        _unlink(path)
        return None
    finally:
        os.close(fd)


_said_full = False  # the consumer's /dev/shm was found full: said once per process


def consumer_slot(name: str, wid: int):
    """The consumer's status slot for actor ``wid``, or None (one warning) when /dev/shm cannot
    hold its page: the actor then keeps its own slot, as on another node."""
    global _said_full
    try:
        segment = shm.create_status(name)
    except shm.NoRoom as exc:
        if not _said_full:
            _said_full = True
            warnings.warn(
                f"{exc.shortage.text(f'the status slot of Ray actor {wid}')}: actors on this node keep "
                "their status in a slot of their own instead, or none where that does not fit either (a "
                f"death there then charges no sample). To keep it, {shm.FIXES}.",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    shm.status_cells(segment)[0] = -1  # idle until the actor writes it
    return segment


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sweep(prefix: str) -> int:
    """Remove this machine's slots named ``prefix...``; how many there were."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        _unlink(os.path.join(SHM_DIR, name))
    return len(names)


class _Actor:
    """One actor as a ``protocol.Worker``: its handle, its pending ``run`` calls, and its status."""

    def __init__(self, wid: int, handle, segment, pool: RayPool):
        self.wid, self.handle, self.segment, self._pool = wid, handle, segment, pool
        self.cells: np.ndarray | None = (
            None if segment is None else shm.status_cells(segment)
        )  # None: /dev/shm was full
        self.outstanding: OrderedDict[int, BatchTask] = OrderedDict()
        self.pending: dict = {}  # ObjectRef of a run call -> its task id
        self.polled: tuple | None = None  # last status() answer: (task_id, position, seconds)
        self.status_ref = None
        self.status_asked = 0.0
        self.started_ref = handle.started.remote()  # resolves once the actor runs (or failed to start)
        self.spawned = time.monotonic()
        self.placed = False
        self.pid: Any = None  # these three: set by place()
        self.node_id: Any = None
        self.kept: Any = None
        self.warned_late = False

    def place(self, info: tuple) -> None:
        self.pid, self.node_id, self.kept = info
        self.placed = True

    @property
    def attached(self) -> bool:
        """Its status is the consumer's own shared-memory slot (an actor on the consumer's node)."""
        return self.kept == "shared" and self.cells is not None

    def send(self, task: BatchTask) -> None:
        self.outstanding[task.task_id] = task
        self.pending[self.handle.run.remote(task)] = task.task_id

    def running(self) -> Running | None:
        """From the shared slot on the consumer's node; else the actor's own last answer
        (elapsed as the actor measured it: never a stale guess of ours)."""
        if self.attached:
            assert self.cells is not None  # attached: it has cells
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
        if self.segment is not None:
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
    workers: dict[int, _Actor]
    share_status = True  # False: actors on the consumer's node keep their own slots too, as remote ones (tests)

    def __init__(self, ctx: WorkContext, size: int, timeout: float | None):
        self.address = connect()
        self.node_id = ray.get_runtime_context().get_node_id()  # the consumer's node
        self.token = shm.owner_token()  # names our actors and status slots (the leak checks look for it)
        self._own_slots = f"{shm.PREFIX}{self.token}a"  # prefix of the slots actors keep on their nodes
        self._shm = shm_identity()  # an actor that sees the same /dev/shm maps the consumer's slots
        self._cluster_lost = False  # then no more Ray calls: they would block on the missing head
        self._ctx_ref: ray.ObjectRef | None = ray.put(ctx)  # one copy, shared by every actor and every respawn
        self._agents: dict[str, Any] = {}  # node id -> NodeAgent
        self._lost_nodes: set[str] = set()
        self._idle_since: float | None = time.monotonic()  # since when no actor has been running
        super().__init__(ctx, size, timeout)

    def cluster_alive(self) -> bool:
        return ray.is_initialized() and not self._cluster_lost

    # -- actors -------------------------------------------------------------------------
    def _new_worker(self, wid: int) -> _Actor:
        segment = consumer_slot(f"{self.token}r{wid}", wid) if self.share_status else None
        shared = "" if segment is None else segment.name
        try:
            # ignore: mypy keeps a decorated class's own type; @ray.remote made it an ActorClass with .options
            handle = BatchActor.options(  # type: ignore[attr-defined]
                name=f"{ACTOR_PREFIX}{self.token}-{wid}",
                max_concurrency=1,
                **ACTOR_OPTIONS,
                max_restarts=0,
                max_task_retries=0,  # the scheduler decides what a lost task becomes
            ).remote(self._ctx_ref, shared, self.node_id, f"{self._own_slots}{wid}", self._shm)
        except BaseException:
            if segment is not None:
                shm.release(segment)
            raise
        return _Actor(wid, handle, segment, self)

    def _running_actors(self) -> list[_Actor]:
        return [a for a in self.workers.values() if a.placed]

    def _on_started(self, actor: _Actor) -> list[Event]:
        ref, actor.started_ref = actor.started_ref, None
        try:
            info = self._guard(ray.get, ref)
        except RayError as exc:  # it never ran: e.g. the source or transform fails to unpickle there
            return [self._lose(actor.wid, "died", f"Ray actor failed to start: {_first_line(exc)}")]
        actor.place(info)
        self._idle_since = None
        if actor.kept not in (None, "shared") and actor.node_id not in self._agents:
            self._agents[actor.node_id] = NodeAgent.options(  # type: ignore[attr-defined]  # an ActorClass, as above
                name=f"{ACTOR_PREFIX}{self.token}-agent-{actor.node_id[:12]}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(actor.node_id, soft=False),
            ).remote()  # started now, so it is up by the time an actor there dies
        return []

    def _check_placement(self) -> None:
        """Raise when no actor has run for START_SECONDS; name actors still waiting, once."""
        now = time.monotonic()
        if self._idle_since is not None and now - self._idle_since > START_SECONDS:
            raise RayClusterLost(
                f"no Ray actor of this loader has been running for {START_SECONDS:.0f}s on the cluster at "
                f"{self.address}: {len(self.workers)} waiting to start, each needs {_needs()} "
                f"({_available_cpus()} CPUs available now). Lower workers, give the cluster more CPUs, or check "
                "that its nodes are alive.",
                address=self.address,
            )
        late = [
            a for a in self.workers.values() if not a.placed and not a.warned_late and now - a.spawned > START_SECONDS
        ]
        if late:
            for actor in late:
                actor.warned_late = True
            warnings.warn(
                f"{len(late)} of {len(self.workers)} Ray actors not started within {START_SECONDS:.0f}s on the "
                f"cluster at {self.address} (each needs {_needs()}; {_available_cpus()} CPUs available now): the "
                f"epoch runs on the {len(self._running_actors())} running, and the others join when placed.",
                RuntimeWarning,
                stacklevel=2,
            )

    def actor_pids(self) -> list[int]:
        """Process ids of this pool's running actors (for tests and diagnostics)."""
        return [a.pid for a in self._running_actors()]

    def actor_nodes(self) -> dict[int, str]:
        """Worker id -> node id of this pool's running actors (for tests and diagnostics)."""
        return {a.wid: a.node_id for a in self._running_actors()}

    # -- the protocol, on running actors only ---------------------------------------------
    def free_slots(self) -> int:
        return sum(TASKS_PER_WORKER - len(a.outstanding) for a in self._running_actors())

    def idle_workers(self) -> int:
        return sum(not a.outstanding for a in self._running_actors())

    def submit(self, task: BatchTask) -> None:
        actor = min(self._running_actors(), key=lambda a: len(a.outstanding))
        actor.send(self._prepare(task, actor))

    # -- the WorkerPool hooks -------------------------------------------------------------
    def _prepare(self, task: BatchTask, worker: _Actor) -> BatchTask:
        self._check_cluster()
        return task

    def _wait_interval(self, timeout: float) -> float:
        return min(timeout, POLL_SECONDS)

    def _check(self) -> list[Event]:
        self._check_placement()
        self._poll_status()
        return self._expire_timeouts()

    def _lose(self, wid: int, cause: str, detail: str) -> Lost:
        lost = super()._lose(wid, cause, detail)  # its replacement only starts: it joins when placed
        if self._idle_since is None and not self._running_actors():
            self._idle_since = time.monotonic()
        return lost

    def _last_status(self, actor: _Actor, cause: str, detail: str):
        """Where a lost actor was: what it wrote itself, or nothing when its node went (module doc)."""
        if cause != "died":
            return actor.running(), detail  # a timeout: the actor's own report of a sample past it
        self._check_head()  # actors die with their node: was it the head?
        if not actor.placed:
            return None, detail
        gone = self._node_gone(actor.node_id)
        if gone is not None:
            self._lost_nodes.add(actor.node_id)
            return None, f"{detail}; its node {actor.node_id[:12]} was lost ({gone}), so no sample is charged"
        if actor.attached:
            return actor.running(), detail
        return self._left_status(actor, detail)

    def _left_status(self, actor: _Actor, detail: str):
        """The status a dead actor left in its own slot, read on its node by this pool's agent there."""
        if actor.kept is None:
            return None, f"{detail}; it could keep no status on its node (no {SHM_DIR}), so no sample is charged"
        try:
            left = ray.get(self._agents[actor.node_id].last_status.remote(actor.kept), timeout=AGENT_SECONDS)
        except RayError as exc:  # GetTimeoutError included: an agent that cannot answer blames nobody
            return (
                None,
                f"{detail}; its last status could not be read on its node ({_first_line(exc)}), so no "
                "sample is charged",
            )
        if left is None or left[0] < 0:
            return None, detail
        return Running(int(left[0]), as_position(left[1]), 0.0), detail

    def _node_gone(self, node_id: str) -> str | None:
        """Why the node is lost (listed dead, or its raylet refuses connections), or None if it is up."""
        node = next((n for n in self._guard(ray.nodes) if n["NodeID"] == node_id), None)
        if node is None or not node["Alive"]:
            return "the cluster lists it as dead"
        try:
            socket.create_connection(
                (node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=HEAD_PROBE_SECONDS
            ).close()
        except OSError as exc:
            return f"its raylet does not answer: {exc}"
        return None

    def shutdown(self) -> None:
        starting = [a.started_ref for a in self.workers.values() if a.started_ref is not None]
        try:
            super().shutdown()
        finally:
            self._settle(starting)
            self._close_agents()
            self._ctx_ref = None

    def _settle(self, starting: list) -> None:
        """Wait until the ``started`` calls still pending have answered or failed (the actor is
        killed by now): one answering makes its status slot first, so the sweep after finds it."""
        if not starting or not self.cluster_alive():
            return
        try:
            ray.wait(starting, num_returns=len(starting), timeout=KILL_SECONDS)
        except RayError:
            pass  # the cluster went meanwhile: the actors went with it

    def _close_agents(self) -> None:
        agents, self._agents = self._agents, {}
        live = {node: a for node, a in agents.items() if node not in self._lost_nodes}
        if live and self.cluster_alive():
            try:
                ray.wait(
                    [a.sweep.remote(self._own_slots) for a in live.values()],
                    num_returns=len(live),
                    timeout=SWEEP_SECONDS,
                )
            except RayError:
                pass  # a node that went meanwhile: its slots went with it
        if self.cluster_alive():
            for agent in agents.values():
                _kill(agent)
        _sweep(self._own_slots)  # nodes that shared the consumer's machine and died left theirs here

    # -- results and deaths ---------------------------------------------------------------
    def _collect(self, timeout: float) -> list[Event]:
        self._check_cluster()
        owners: dict[Any, _Actor] = {}
        for actor in self.workers.values():
            owners.update(dict.fromkeys(actor.pending, actor))
            if actor.started_ref is not None:  # a placement wakes the wait too
                owners[actor.started_ref] = actor
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
            if self.workers.get(actor.wid) is not actor:  # a loss earlier in this loop may have replaced it
                continue
            events.extend(self._receive(actor, ref) if ref in actor.pending else self._on_started(actor))
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

    # -- status of remote actors, for timeouts ---------------------------------------------
    def _poll_status(self) -> None:
        if self.timeout is None:
            return  # only timeouts need a live view; a death is charged from the slot the actor left
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
        for actor in self._running_actors():
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
            f"({why}); the epoch cannot continue. Re-create the Loader after reconnecting.",
            address=self.address,
        )

    def _guard(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except (RaySystemError, GetTimeoutError) as exc:
            raise self._lost(_first_line(exc)) from exc
        except ValueError as exc:  # refs of a previous session: the cluster was restarted under us
            if "owner is unknown" in str(exc):
                raise self._lost("its objects are gone") from exc
            raise


def _needs() -> str:
    """What one actor asks for, for messages: "1 CPU" and any resources added to ACTOR_OPTIONS."""
    extra = ACTOR_OPTIONS.get("resources") or {}
    return ", ".join([f"{ACTOR_OPTIONS.get('num_cpus', 1)} CPU", *(f"{v} {k}" for k, v in extra.items())])


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
