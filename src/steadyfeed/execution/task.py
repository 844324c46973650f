"""What travels between the consumer and a worker: tasks in, results out.

Only small metadata travels through pipes; batch arrays travel through shared
memory in process mode (see ``shm.py``) and by reference in thread mode.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..sampling.plan import BatchSpec

# Positions reported by a worker's status slot when it is not inside one sample.
READING_BATCH = -1  # inside source.read_many for the whole batch
COLLATING = -2  # writing the batch out


@dataclass
class WorkContext:
    """Everything a worker needs besides tasks; pickled once per worker process."""

    source: Any
    transform: Callable | None
    seed: int
    retries: int
    stop_on_failure: bool  # on_error="raise": no point finishing a batch that will raise
    niceness: int = 0  # how much lower than the consumer's the workers' CPU priority is


@dataclass
class BatchTask:
    task_id: int
    epoch: int
    spec: BatchSpec
    excluded: frozenset = frozenset()  # positions that already failed for good (death, timeout)
    prior_attempts: dict = field(default_factory=dict)  # position -> attempts used before this task
    batched_read: bool = True  # False after a worker died inside read_many: pins the next death on a sample
    shm_name: str | None = None


@dataclass
class SampleFailure:
    position: int
    sample_id: int
    attempts: int
    error_type: str
    message: str
    traceback: str
    exception: BaseException | None = None
    cause: str = "error"  # "error" (raised), "timeout" (ran past timeout) or "died" (worker died on it)


@dataclass
class BatchResult:
    task_id: int
    batch_index: int
    arrays: dict[str, np.ndarray] | None  # None: no rows (every sample failed) or shipped via shm
    failures: list[SampleFailure]
    timings: dict[str, float]
    layout: list | None = None  # process mode: where each array lies in the shared segment ...
    shm_name: str | None = None  # ... and which segment (the task's slot)


class StatusSlot:
    """Three numbers a worker updates and the consumer reads without locks:
    the task id (-1 when idle), the position in the batch, and when it started.

    ``cells`` is a list in thread mode and a shared ``RawArray('d', 3)`` in process
    mode; ``time.monotonic`` is one system-wide clock, so both sides agree.
    """

    def __init__(self, cells):
        self.cells = cells
        self.cells[0] = -1

    def begin(self, task_id: int, position: int) -> None:
        self.cells[2] = time.monotonic()
        self.cells[1] = position
        self.cells[0] = task_id

    def idle(self) -> None:
        self.cells[0] = -1

    def read(self) -> tuple[int, int, float] | None:
        task_id, position, started = self.cells[0], self.cells[1], self.cells[2]
        if task_id < 0:
            return None
        return int(task_id), int(position), float(started)
