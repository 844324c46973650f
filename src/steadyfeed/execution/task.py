"""What travels between the consumer and a worker: tasks in, results out, and the status a
worker shows while it works.

Every message is an immutable value, built once where it is made: the consumer builds a
:class:`BatchTask`, ``run_batch`` builds a :class:`BatchResult`, and a transport that moves
the arrays (shared memory, Ray's object store) builds a new result around the arrays it
received (:meth:`BatchResult.received`) rather than filling one in. Only small metadata
travels through pipes; batch arrays travel through shared memory in process mode (see
``shm.py``) and by reference in thread mode.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sampling.plan import BatchSpec


class Stage(enum.IntEnum):
    """Where a worker is in a task when it is not inside one sample. The values are what its
    status slot holds in place of a sample position (positions are >= 0)."""

    READING_BATCH = -1  # inside source.read_many / read_batch for the whole batch
    COLLATING = -2  # writing the batch out


def evolved(record, **changes):
    """``dataclasses.replace(record, **changes)`` for this module's records, which run no
    ``__post_init__`` and keep their fields in ``__dict__``. A few are made again for every
    batch, and ``replace`` (which reads the fields anew and calls ``__init__``) costs several
    times more than this copy."""
    assert changes.keys() <= record.__dict__.keys(), f"no such field: {changes.keys() - record.__dict__.keys()}"
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__, **changes)
    return new


@dataclass(frozen=True)
class Running:
    """What a worker is doing: task ``task_id``, at ``position`` (a sample's place in the batch,
    or a :class:`Stage`), for ``elapsed`` seconds."""

    task_id: int
    position: int | Stage
    elapsed: float

    @property
    def in_sample(self) -> bool:
        """Inside one sample: the only place a timeout can blame (a stage is the batch's)."""
        return not isinstance(self.position, Stage)


@dataclass(frozen=True)
class WorkContext:
    """Everything a worker needs besides tasks; pickled once per worker process."""

    source: Any
    transform: Callable | None
    seed: int
    retries: int
    stop_on_failure: bool  # on_error="raise": no point finishing a batch that will raise
    niceness: int = 0  # how much lower than the consumer's the workers' CPU priority is
    collate: str = "stack"  # ReadOptions.collate: how samples become a batch (batch.py)


@dataclass(frozen=True)
class BatchTask:
    task_id: int
    epoch: int
    spec: BatchSpec
    excluded: frozenset = frozenset()  # positions that already failed for good (death, timeout)
    prior_attempts: Mapping[int, int] = field(default_factory=dict)  # position -> attempts used before
    batched_read: bool = True  # False after a worker died inside read_many: pins the next death on a sample
    shm_name: str | None = None  # process mode: the slot the worker writes the batch into
    batches: int = 1  # how many of the plan's batches the spec holds (grouping.py)


@dataclass(frozen=True)
class SampleFailure:
    position: int
    sample_id: int
    attempts: int
    error_type: str
    message: str
    traceback: str
    exception: BaseException | None = None
    cause: str = "error"  # "error" (raised), "timeout" (ran past timeout) or "died" (worker died on it)


@dataclass(frozen=True)
class Disagreement:
    """Samples of one batch that each read fine but cannot be collated together: plain data,
    so it travels back from any worker; the consumer turns it into a ``CollateError``.

    ``ids[0]`` is the first sample of the batch, ``ids[1]`` (when there is one) the first that
    differs from it; ``found`` says what each has. ``what`` is "keys", "shape", "dtype",
    "strings" (of different widths), "ndim" or "name" (a key that ``collate="pad"`` would add
    is already there)."""

    what: str
    key: str | None
    ids: tuple[int, ...]
    found: tuple[str, ...]
    collate: str


@dataclass(frozen=True)
class BatchResult:
    task_id: int
    batch_index: int
    arrays: dict[str, np.ndarray] | None  # None: no rows (every sample failed, or a disagreement), or not received yet
    failures: tuple[SampleFailure, ...]
    timings: Mapping[str, float]
    disagreement: Disagreement | None = None  # set: the batch cannot be collated (arrays is None)

    def received(self, arrays: dict[str, np.ndarray] | None, transport_seconds: float) -> BatchResult:
        """This result with the arrays a transport delivered and the time that took."""
        return evolved(self, arrays=arrays, timings={**self.timings, "transport": transport_seconds})


@dataclass(frozen=True)
class ShippedResult:
    """A process worker's result: the arrays are in shared-memory slot ``shm_name`` at
    ``layout``, where the consumer lends or copies them; with ``layout`` None they travel in
    ``result`` itself (none, or a batch sent by pipe), and ``shm_name`` is the slot the task
    named, if any. ``shortage`` (a ``shm.Shortage``): shared memory had no room for that slot,
    which is why this batch came by pipe."""

    result: BatchResult  # with arrays=None when they are in the slot
    layout: tuple | None  # a shm.Layout
    shm_name: str | None
    shortage: Any = None
    generation: int = 0  # how many times the worker had created slot ``shm_name`` (it grows by re-creation)


class StatusSlot:
    """Three numbers a worker updates and the consumer reads without locks:
    the task id (-1 when idle), the position in the batch (or a :class:`Stage`), and when it
    started.

    ``cells`` is a list in thread mode and three float64 cells in shared memory in process
    and Ray mode; ``time.monotonic`` is one system-wide clock, so both sides agree.
    """

    def __init__(self, cells):
        self.cells = cells
        self.cells[0] = -1

    def begin(self, task_id: int, position: int | Stage) -> None:
        self.cells[2] = time.monotonic()
        self.cells[1] = int(position)
        self.cells[0] = task_id

    def idle(self) -> None:
        self.cells[0] = -1

    def read(self) -> Running | None:
        task_id, position, started = self.cells[0], self.cells[1], self.cells[2]
        if task_id < 0:
            return None
        return Running(int(task_id), as_position(position), time.monotonic() - float(started))


def as_position(value: float) -> int | Stage:
    """A status slot's position cell as a sample position or a :class:`Stage`."""
    value = int(value)
    return Stage(value) if value < 0 else value
