"""The pool protocol: how the scheduler hands batch tasks to whoever makes them, and what
comes back. One small protocol for every mode (threads, processes, Ray actors, none), so
order, exactly-once delivery, retries and the failure policy live in the scheduler alone.

A :class:`Pool` takes tasks (``submit``, while ``free_slots() > 0``) and reports what
happened to them as events: ``Done(result)`` for a finished task, and ``Lost(tasks,
running, cause, detail)`` for a worker that died or ran a sample past the timeout. A lost
worker has already been replaced when its event arrives; the scheduler decides what its
tasks become. ``run_here`` makes a batch in the caller's thread, which every pool can do.

A :class:`Worker` is one thread, process or actor of a pool; the shared bookkeeping of
pools of workers is ``pool.WorkerPool``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from .task import BatchResult, BatchTask, Running


@dataclass(frozen=True)
class Done:
    result: BatchResult


@dataclass(frozen=True)
class Lost:
    tasks: tuple[BatchTask, ...]  # every task the worker held, in the order it got them
    running: Running | None  # where it was when lost, if inside a task
    cause: str  # "died" or "timeout"
    detail: str


Event = Done | Lost


class Pool(Protocol):
    def free_slots(self) -> int:
        """How many more tasks ``submit`` takes now."""

    def idle_workers(self) -> int:
        """How many workers hold no task at all."""

    @property
    def all_delivered(self) -> bool:
        """Whether every worker has returned a result (has started); True without workers."""

    def submit(self, task: BatchTask) -> None:
        """Hand ``task`` to a worker; its outcome arrives later as an event."""

    def run_here(self, task: BatchTask) -> BatchResult:
        """Make the batch in the caller's thread (never interrupted: no timeout applies)."""

    def drain(self) -> list[Event]:
        """Events that already happened, without blocking."""

    def wait(self, timeout: float) -> list[Event]:
        """Events, waiting up to ``timeout`` seconds for the first."""

    def shutdown(self) -> None:
        """Stop every worker and release everything the pool holds."""


class Worker(Protocol):
    wid: int
    outstanding: OrderedDict[int, BatchTask]  # task id -> task, in the order sent

    def send(self, task: BatchTask) -> None:
        """Queue ``task`` (recorded in ``outstanding`` until the pool takes its result)."""

    def running(self) -> Running | None:
        """What the worker is doing now, as far as the consumer can tell."""

    def signal_stop(self) -> None:
        """Ask the worker to stop, without waiting (so a pool stops its workers in parallel)."""

    def stop(self) -> None:
        """Stop the worker for good (bounded wait, then force) and release what it holds."""

    def abandon(self) -> None:
        """Stop waiting for the worker at once: kill it, or leave a stuck thread behind."""
