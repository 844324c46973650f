"""Loader: the public face of the engine; its guarantees are in the class docstring, each
proven by a test named on the documentation's Guarantees page."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import re
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from operator import methodcaller
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .autopack import AutoPack, close_reader
from .config import AUTO, ExecutionOptions, FailureOptions, LoaderConfig, Mode, ReadOptions, ShardOptions, workers_count
from .diagnostics.isolation import read_exclusions
from .errors import SampleError, SampleTimeout, TooManyErrors, WorkerDied, with_original_type
from .execution import auto
from .execution.auto import AutoChoice
from .execution.batch import collate_error
from .execution.grouping import LEARN_BATCHES, Grouping, make_grouping, per_task_rule
from .execution.handoff import FixedHandoff, MeasuredHandoff, make_handoff, work_seconds
from .execution.pool import InlinePool, finish_each, make_pool
from .execution.scheduler import ByteBudget, EpochRun, Outcome
from .execution.task import SampleFailure, WorkContext
from .quarantine import Quarantine, QuarantineEntry
from .sampling.elastic import remainder_chain
from .sampling.exclusion import Exclusions, excluding
from .sampling.plan import EpochPlan
from .sampling.samplers import ORDER_FORMAT, SequentialSampler, ShuffleSampler, order_of
from .sources.base import check_source, close_source, fingerprint, locate
from .sources.wrapper import SourceWrapper
from .stats import LoaderStats

if TYPE_CHECKING:  # the frameworks are imported only when asked for
    import tensorflow as tf

    from .integration.keras_dataset import KerasDataset
    from .integration.torch_dataset import TorchBatches

STATE_FORMAT = "steadyfeed.loader/2"  # /2: orders are keyed Feistel permutations (sampling/permutation.py)
_OLD_FORMATS = {"steadyfeed.loader/1": "numpy permutations drawn whole"}
_ERROR_CLASSES = {"error": SampleError, "timeout": SampleTimeout, "died": WorkerDied}


class Loader:
    """Batches of a random-access ``source``, read and transformed by concurrent workers.

    Guarantees:

    * every sample of the shard's plan is delivered exactly once per epoch, with its own
      label, or raised / quarantined as a :class:`SampleError`; samples that each read fine
      but cannot share a batch raise :class:`CollateError` under any ``on_error`` (no sample
      is charged for it);
    * the same seed gives bit-identical batches for any ``workers`` and ``mode``, and with
      ``pack_to`` whether an epoch reads the files or the pack;
    * excluded ids (``exclude=``, ``loader.exclude``) are left out of the plan of every epoch
      they apply to: each other sample is still delivered exactly once, for any shards and
      policy, and a saved state keeps them excluded;
    * at most ``prefetch`` batches are in flight or waiting;
    * a dead or hung worker is detected, never waited on forever;
    * leaving an epoch early, an exception or ``close()`` stops every worker and
      releases every shared-memory segment.

    Options (``config.py``, where each is documented) come as flat keywords, e.g.
    ``Loader(source, 64, shuffle=True, workers=4, mode="process", on_error="skip")``, as
    groups (``read=ReadOptions(...)``, ``execution=ExecutionOptions(...)``,
    ``failure=FailureOptions(...)``, ``sharding=ShardOptions(...)``), or as one
    ``config=LoaderConfig(...)``; ``loader.config`` is the config in use.

    ``iter(loader)`` runs from the loader's cursor: the next batch not yet handed out (the
    start of the next epoch after a finished one; after ``load_state_dict``, the saved
    position). ``loader.epoch(e)`` yields the batches of epoch ``e`` from its start.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int | None = None,
        *,
        config: LoaderConfig | None = None,
        read: ReadOptions | None = None,
        execution: ExecutionOptions | None = None,
        failure: FailureOptions | None = None,
        sharding: ShardOptions | None = None,
        **options: Any,
    ) -> None:
        check_source(source)
        if batch_size is not None:
            options["batch_size"] = batch_size
        if config is not None and not isinstance(config, LoaderConfig):
            raise TypeError(f"config must be a LoaderConfig, got {type(config).__name__}")
        self.source = source
        self.config = LoaderConfig.build(
            config, read=read, execution=execution, failure=failure, sharding=sharding, **options
        )
        refuse_unsupported(source, self.config.execution)  # before anything starts, so nothing is left running
        cfg = self.config.read
        self.sampler = cfg.sampler or (ShuffleSampler() if cfg.shuffle else SequentialSampler())
        self._quarantine = Quarantine(self.config.failure.quarantine)
        self._stats = LoaderStats()
        self._cursor = (0, 0)  # (epoch, next batch index)
        self._exclusions = self._checked_exclusions(read_exclusions(cfg.exclude))
        self._running: int | None = None  # the epoch an iterator is running, if any
        self._cached_plan: tuple = (None, None, None)  # (epoch, exclusions, plan)
        self._remainder: tuple | None = None  # (epoch, levels): an epoch resumed from other shards (merge_states)
        self._source_identity: dict | None = None  # computed once, when a state is first saved or loaded
        pack_to = self.config.execution.pack_to
        execution = self.config.execution
        self._autopack = AutoPack(pack_to, source, execution.pack_decoded) if pack_to is not None else None
        self._reader = source  # what the workers read: the source, or its pack once one is ready (autopack.py)
        self._pool = None
        self._stopping: list = []  # pools whose shutdown a Ctrl-C cut short (_retire finishes them)
        # what workers=None (not given) means: 0, or "auto" once as_keras() serves the loader
        self._unset_workers: int | Literal["auto"] = 0
        self._auto: AutoChoice | None = None  # what workers="auto" picked (execution/auto.py)
        self._auto_since = (0, 0.0)  # (batches, seconds of batch work) counted at the last check
        self._auto_cost: float | None = None  # work per batch in the first stretch after a pick
        self._running_config = self._resolved_config()  # config with workers an int: what the pool runs
        # batches a task holds (made anew with each pool), before the handoff, which reads it
        self._grouping = make_grouping(self._running_config.execution, cfg.collate)
        self._handoff = self._new_handoff()  # who makes each batch; measured anew with each new pool
        self._budget = ByteBudget(self.config.execution.max_inflight_bytes)  # learns batch sizes across epochs
        self._task_ids = itertools.count()
        self._active = threading.Lock()  # one epoch at a time
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown_pool, self.__dict__)

    def replace(self, **changes: Any) -> Loader:
        """A new loader over the same source with some options changed, e.g.
        ``loader.replace(workers=4, mode="process")``. The new loader starts at epoch 0, with
        this one's exclusions (``exclude()`` included) unless ``exclude`` is among the changes."""
        copy = Loader(self.source, config=self.config.replace(**changes))
        if "exclude" not in changes:
            copy._exclusions = self._exclusions
        return copy

    # -- plan ---------------------------------------------------------------------------
    def _plan(self, epoch: int) -> EpochPlan:
        """Epoch ``epoch``'s plan for this shard: a few integers and a lazy order (``plan.py``)."""
        cached_epoch, cached_exclusions, plan = self._cached_plan
        if cached_epoch != epoch or cached_exclusions is not self._exclusions:  # keying an order takes a moment
            read, shard = self.config.read, self.config.sharding
            order = order_of(self.sampler, len(self.source), read.seed, epoch)
            order = excluding(order, self._exclusions.at(epoch))
            levels = self._remainder[1] if self._remainder and self._remainder[0] == epoch else []
            plan = EpochPlan(
                order,
                batch_size=read.batch_size,
                shard_index=shard.shard_index,
                shard_count=shard.shard_count,
                last_batch=read.last_batch,
                remainder=remainder_chain(len(order), levels),
            )
            self._cached_plan = (epoch, self._exclusions, plan)
        return plan

    def __len__(self) -> int:
        """Batches per epoch for this shard (an upper bound when samples are skipped)."""
        return len(self._plan(self._cursor[0]))

    @property
    def cursor(self) -> tuple[int, int]:
        """``(epoch, next batch)``: where ``iter(loader)`` starts (``state_dict`` without the fingerprint)."""
        return self._cursor

    def batches_in(self, epoch: int) -> int:
        """Batches in epoch ``epoch`` of this shard (``len(loader)`` is the cursor's epoch's)."""
        return len(self._plan(int(epoch)))

    def seek(self, epoch: int, next_batch: int = 0) -> None:
        """Move the cursor: the next ``iter(loader)`` starts at batch ``next_batch`` of ``epoch``
        (``load_state_dict`` without a saved state, for a position computed in this process).
        An iterator already running goes on with its own epoch: close it first."""
        epoch, next_batch = int(epoch), int(next_batch)
        if epoch < 0 or not 0 <= next_batch <= self.batches_in(epoch):
            raise IndexError(f"no batch {next_batch} in epoch {epoch} ({self.batches_in(epoch)} batches)")
        self._cursor = (epoch + 1, 0) if next_batch == self.batches_in(epoch) else (epoch, next_batch)

    # -- iteration ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        epoch, start = self._cursor
        return self._run(epoch, start)

    def epoch(self, epoch: int) -> Iterator[dict]:
        """The batches of epoch ``epoch``, from its first batch."""
        return self._run(int(epoch), 0)

    def _run(self, epoch: int, start: int) -> Iterator[dict]:
        if self._closed:
            raise RuntimeError("this Loader is closed")
        plan = self._plan(epoch)
        if not self._active.acquire(blocking=False):
            raise RuntimeError(
                "this Loader is already running an epoch; finish or close that iterator first (a "
                "KerasDataset keeps the epoch it serves open between Keras calls: close() it)"
            )
        started = time.perf_counter()  # first-batch latency includes starting the workers
        self._running = epoch
        try:
            self._choose_reader()
            self._choose_workers(epoch)
            run = self._epoch_run(
                self._ensure_pool(),
                self._handoff,
                plan,
                epoch,
                start,
                self._running_config.execution.effective_prefetch,
                self._stats,
                self._grouping,
            )
            if self._autopack is not None and self._reader is self.source:
                self._autopack.start(self.source)  # packs in the background while this epoch reads the files
            skipped_before = self._quarantine.count(epoch)
            planned = plan.num_real_total
            for outcome in run:
                if outcome.spec.index == start:
                    self._stats.first_batch_seconds = time.perf_counter() - started
                batch = self._deliver(outcome, epoch, planned, skipped_before)
                next_index = outcome.spec.index + 1
                self._cursor = (epoch + 1, 0) if next_index >= len(plan) else (epoch, next_index)
                if batch is not None:
                    yield batch
            self._cursor = (epoch + 1, 0)
        except BaseException as exc:  # early exit (GeneratorExit), an error, Ctrl-C: stop everything now
            self._stop_pool_for(exc)
            raise
        finally:
            self._running = None
            self._active.release()

    def _stop_pool_for(self, exc: BaseException) -> None:
        """Stop the workers as ``exc`` leaves the epoch. A second Ctrl-C while they stop makes the
        pool stop waiting and kill (or leave) the rest; it is folded into the first one, which
        goes on alone, rather than printing a second traceback from inside the shutdown."""
        try:
            self._shutdown_pool()
        except KeyboardInterrupt:
            if not isinstance(exc, KeyboardInterrupt):
                raise

    def _epoch_run(
        self, pool, handoff, plan, epoch: int, start: int, prefetch: int, stats: LoaderStats, grouping: Grouping
    ) -> EpochRun:
        failure = self.config.failure
        return EpochRun(
            pool,
            plan,
            epoch=epoch,
            start=start,
            prefetch=prefetch,
            retries=failure.retries,
            stop_on_failure=pool.ctx.stop_on_failure,
            task_ids=self._task_ids,
            max_blameless_deaths=max(3, 2 * workers_count(self._running_config.execution.workers)),
            stats=stats,
            handoff=handoff,
            budget=self._budget,
            grouping=grouping,
        )

    def peek(self, batch_index: int = 0, epoch: int | None = None) -> dict:
        """Batch ``batch_index`` of ``epoch`` (default: the cursor's), computed in this thread.

        Identical to what iteration yields for that batch (it is made by the same scheduler,
        as with ``workers=0``), without starting workers or moving the cursor: for inspecting
        a batch, or telling a framework the shapes. Failures raise as under on_error="raise".
        """
        epoch = self._cursor[0] if epoch is None else int(epoch)
        plan = self._plan(epoch)
        if not 0 <= batch_index < len(plan):
            raise IndexError(f"batch {batch_index} out of range: epoch {epoch} has {len(plan)} batches")
        run = self._epoch_run(
            InlinePool(self._work_context(stop_on_failure=True)),
            FixedHandoff(to_workers=False),
            plan,
            epoch,
            batch_index,
            prefetch=1,
            stats=LoaderStats(),
            grouping=Grouping(),  # one batch, made here: nothing to group or to learn from
        )
        outcome = next(iter(run))
        if outcome.failures:
            raise self._sample_error(outcome.failures[0], epoch, batch_index)
        if outcome.disagreement is not None:
            raise collate_error(outcome.disagreement, self.source, epoch, batch_index)
        return self._public(outcome.arrays)

    def _choose_reader(self) -> None:
        """At an epoch's start: read the pack once it is ready (``pack_to``). The workers hold
        the reader, so they are restarted on the pack, once; an epoch never switches midway."""
        if self._autopack is not None and self._reader is self.source and self._autopack.ready:
            reader = self._autopack.open(self.source)
            self._shutdown_pool()
            self._reader = reader
        self._stats.reading = "files" if self._reader is self.source else "pack"

    @property
    def reading(self) -> str:
        """What the current or last epoch read: ``"files"`` (the source) or ``"pack"`` (``pack_to``)."""
        return self._stats.reading

    def wait_for_pack(self, timeout: float | None = None) -> bool:
        """Wait for a ``pack_to`` pack under way to be published; whether one is ready (the
        next epoch then reads it). False without ``pack_to``."""
        return self._autopack is not None and self._autopack.wait(timeout)

    def _work_context(self, stop_on_failure: bool) -> WorkContext:
        read = self.config.read
        return WorkContext(
            self._reader,
            read.transform,
            int(read.seed),
            self.config.failure.retries,
            stop_on_failure,
            self.config.execution.worker_niceness,
            read.collate,
        )

    def _public(self, batch: dict) -> dict:
        """The batch as users see it: "id" only when asked for."""
        if not self.config.read.with_ids:
            batch.pop("id")
        return batch

    # -- workers: how many, which kind ----------------------------------------------------
    def _serve_framework(self) -> None:
        """Called by ``as_keras()``: from now on ``workers=None`` (not given) means "auto"."""
        self._unset_workers = AUTO
        if self._pool is None and self._auto is None:
            self._running_config = self._resolved_config()

    def _resolved_config(self) -> LoaderConfig:
        """The config with ``workers=None`` read as ``_unset_workers``; "auto" stays until measured."""
        execution = self.config.execution.resolved(self._unset_workers)
        if execution.workers == AUTO and self._auto is not None:
            execution = dataclasses.replace(execution, workers=self._auto.workers, mode=self._auto.mode)
        return (
            self.config if execution is self.config.execution else dataclasses.replace(self.config, execution=execution)
        )

    def _choose_workers(self, epoch: int) -> None:
        """At an epoch's start, under ``workers="auto"``: measure and pick, the first time and
        whenever batches have come to cost ``auto.RECHECK_RATIO`` times more or less than in
        the first stretch after the pick. Costs are the stage times the stats count (the
        same units before and after: a probe's wall times are not compared with them)."""
        if self.config.execution.resolved(self._unset_workers).workers != AUTO:
            return
        if self._auto is not None and not self._cost_changed():
            return
        plan = self._plan(epoch)
        probe = auto.measure(lambda k: _nbytes(self.peek(k, epoch)), len(plan))
        budget = auto.memory_budget(self.config.execution.max_inflight_bytes)
        per_task = per_task_rule(self.config.execution, self.config.read.collate)
        choice = auto.choose(
            probe, auto.usable_cores(), budget, self._why_no_processes, per_task, self._trial_of(epoch, len(plan))
        )
        if self._auto is None or (choice.workers, choice.mode) != (self._auto.workers, self._auto.mode):
            self._shutdown_pool()  # started again, as chosen, by _ensure_pool
        self._auto, self._auto_cost = choice, None
        self._auto_since = (self._stats.batches, self._work_seconds())
        self._running_config = self._resolved_config()

    def _trial_of(self, epoch: int, batches: int) -> auto.Trial | None:
        """What times a pool on ``epoch`` for ``auto.choose``: each on the first half of its
        batches, warmed up on them first (``auto.paces``), so both are timed on data they read
        once already, however much of it the page cache holds. None where a half is too short
        to time a pool on (grouping learns a task's size on its first batches)."""
        half = batches // 2
        if half < LEARN_BATCHES + auto.TRIAL_MIN_BATCHES:
            return None
        return lambda mode, workers: self._trial(epoch, half, mode, workers)

    def _trial(self, epoch: int, batches: int, mode: Mode, workers: int) -> Generator[float, None, None]:
        """Batches a second that a pool of ``workers`` ``mode`` workers makes of ``epoch``'s
        first ``batches`` batches, timed at each ``next()`` (``auto.paces``: runs over them again
        and again, the first warming the pool up), handed out as iteration hands them; made and
        dropped, as the probe's are, by a pool of its own, started at the first ``next()`` and
        shut down when this is closed (nothing more: not measured). Each run's plan ends there:
        a window reaching past it sends the workers batches no run takes (where the page cache
        held only the first half, 2 processes were timed at 107 batches/s, against 1,742-1,872
        with plans that end at the half)."""
        execution = dataclasses.replace(self.config.execution.resolved(self._unset_workers), workers=workers, mode=mode)
        stats, grouping, pool, passes = LoaderStats(), make_grouping(execution, self.config.read.collate), None, None
        try:
            pool = self._new_pool(execution, stats, stop_on_failure=True)
            plan = self._plan(epoch)[:batches]  # the stretch alone (see above): a list of its batches
            handoff, prefetch = FixedHandoff(to_workers=True), execution.effective_prefetch

            def runs() -> Generator[Iterator[Outcome], None, None]:
                while True:  # each run ends (its tasks cancelled) before the next starts
                    outcomes = iter(self._epoch_run(pool, handoff, plan, epoch, 0, prefetch, stats, grouping))
                    try:
                        yield outcomes
                    finally:
                        outcomes.close()

            passes = runs()
            yield from auto.paces(passes, lambda: not grouping.learning and pool.all_delivered)
        except Exception:  # noqa: BLE001 - the epoch meets it again, under the loader's on_error
            return
        finally:
            if passes is not None:
                passes.close()
            if pool is not None:
                _retire(self.__dict__, pool)

    def _cost_changed(self) -> bool:
        """Whether the batches made since the last check cost ``RECHECK_RATIO`` times more or
        less than those of the first stretch after the pick (which this then records)."""
        batches, seconds = self._auto_since
        made = self._stats.batches - batches
        if made < auto.MIN_BATCHES_FOR_RECHECK:
            return False  # too few to tell: keep counting from the same mark
        cost = (self._work_seconds() - seconds) / made
        self._auto_since = (self._stats.batches, self._work_seconds())
        if self._auto_cost is None:
            self._auto_cost = cost
            return False
        return auto.cost_changed(self._auto_cost, cost)

    def _why_no_processes(self) -> str | None:
        def unsupported(mode: Mode) -> str | None:
            try:
                refuse_unsupported(self.source, dataclasses.replace(self.config.execution, workers=1, mode=mode))
            except ValueError as exc:
                return str(exc)
            return None

        return auto.can_use_processes(self._work_context(stop_on_failure=True), unsupported)

    def _work_seconds(self) -> float:
        return work_seconds(self._stats.stage_seconds)

    def _ensure_pool(self):
        if self._pool is None:
            execution = self._running_config.execution
            self._pool = self._new_pool(execution, self._stats, self.config.failure.on_error == "raise")
            self._grouping = make_grouping(execution, self.config.read.collate)
            self._handoff = self._new_handoff()  # after the grouping: it reads the batches a task holds
        return self._pool

    def _new_pool(self, execution: ExecutionOptions, stats: LoaderStats, stop_on_failure: bool):
        ctx = self._work_context(stop_on_failure)
        return make_pool(
            execution.mode,
            workers_count(execution.workers),
            ctx,
            self.config.failure.timeout,
            transport=execution.transport,
            stats=stats,
        )

    def _new_handoff(self) -> FixedHandoff | MeasuredHandoff:
        if self._running_config.execution.workers == AUTO:  # not measured yet: no workers to hand to
            return FixedHandoff(to_workers=False)
        grouping = self._grouping  # not self: the handoff lives in the loader's finalizer's arguments
        return make_handoff(
            self._running_config, per_task=lambda: grouping.in_use, steady=lambda: not grouping.learning
        )

    # -- delivery and failure policy ---------------------------------------------------
    def _deliver(self, outcome: Outcome, epoch: int, planned: int, skipped_before: int) -> dict | None:
        if outcome.failures:
            self._take_failures(outcome, epoch, planned, skipped_before)
        self._stats.add_stages(outcome.timings)
        if outcome.disagreement is not None:  # no sample's failure: raised under any on_error, in plan order
            raise collate_error(outcome.disagreement, self.source, epoch, outcome.spec.index)
        batch = outcome.arrays
        if batch is None:
            return None
        self._stats.batches += 1
        self._stats.pack_batches += self._reader is not self.source
        real = batch["id"][batch["mask"] > 0] if "mask" in batch else batch["id"]
        self._stats.samples += len(real)
        self._stats.count_components(self.source, real, ())
        return self._public(batch)

    def _take_failures(self, outcome: Outcome, epoch: int, planned: int, skipped_before: int) -> None:
        """A batch's failed samples: raised (``on_error="raise"``), or quarantined and counted,
        raising once more of the epoch failed than ``max_error_fraction`` allows."""
        spec = outcome.spec
        failures = [f for f in outcome.failures if f.position < spec.num_real]  # fillers fail elsewhere too
        if not failures:
            return
        policy = self.config.failure
        if policy.on_error == "raise":
            raise self._sample_error(failures[0], epoch, spec.index)
        for failure in failures:
            self._quarantine.add(
                QuarantineEntry(
                    sample_id=failure.sample_id,
                    epoch=epoch,
                    batch_index=spec.index,
                    attempts=failure.attempts,
                    error_type=failure.error_type,
                    message=failure.message,
                    location=locate(self.source, failure.sample_id),
                )
            )
        self._stats.skipped += len(failures)
        self._stats.count_components(self.source, (), [f.sample_id for f in failures])
        skipped = self._quarantine.count(epoch) - skipped_before
        if skipped > policy.max_error_fraction * planned:
            raise TooManyErrors(
                f"{skipped} of {planned} samples of epoch {epoch} failed, more than "
                f"max_error_fraction={policy.max_error_fraction}; last: sample {failures[-1].sample_id}: "
                f"{failures[-1].error_type}: {failures[-1].message}. See loader.quarantine_report()."
            )

    def _sample_error(self, failure: SampleFailure, epoch: int, batch_index: int) -> SampleError:
        where = locate(self.source, failure.sample_id)
        message = (
            f"sample {failure.sample_id}{f' ({where})' if where else ''} failed in epoch {epoch}, batch "
            f"{batch_index}, after {failure.attempts} attempt(s): {failure.error_type}: {failure.message}"
        )
        if failure.traceback:
            message += "\n--- worker traceback ---\n" + failure.traceback.rstrip()
        cls: type = _ERROR_CLASSES[failure.cause]
        if failure.exception is not None:  # catchable as what the worker raised, too
            # ignore: mypy checks a class against Hashable by its instances' __hash__ (python/mypy#11470)
            cls = with_original_type(cls, type(failure.exception))  # type: ignore[arg-type]
        error = cls(
            message,
            sample_id=failure.sample_id,
            epoch=epoch,
            batch_index=batch_index,
            attempts=failure.attempts,
            error_type=failure.error_type,
            location=where,
            worker_traceback=failure.traceback,
        )
        error.__cause__ = failure.exception
        return error

    # -- isolation ------------------------------------------------------------------------
    def exclude(self, ids: Iterable[int] | np.ndarray, reason: str = "excluded") -> int:
        """Leave ``ids`` out of every epoch from the next one that has not started, and return
        that epoch: the cursor's epoch when it stands at its start and no epoch is running,
        else the one after (an epoch in progress keeps its plan, so its exactly-once holds).

        Deterministic and recorded: the exclusion is part of every later epoch's plan (each
        remaining sample exactly once, for any workers, mode, shards and ``last_batch``), of
        ``state_dict()`` (a resumed loader keeps it) and of ``replace()``; ``excluded()`` lists
        it. An id already excluded keeps its first record. Every shard of a run must exclude
        the same ids (``merge_states`` refuses states that differ)."""
        epoch, next_batch = self._cursor
        start = self._running + 1 if self._running is not None else epoch + (next_batch > 0)
        self._exclusions = self._checked_exclusions(self._exclusions.add(ids, reason, start))
        return start

    def excluded(self, epoch: int | None = None) -> list[dict]:
        """The exclusions in effect in ``epoch`` (default: all recorded), as the findings'
        ``"excluded"`` section: ``{"id", "reason", "from_epoch"}`` per id, by id."""
        return self._exclusions.report(epoch)

    def excluded_ids(self, epoch: int) -> np.ndarray:
        """The ids left out of epoch ``epoch`` (sorted)."""
        return self._exclusions.at(epoch)

    def _checked_exclusions(self, record: Exclusions) -> Exclusions:
        n = len(self.source)
        if len(record) and (record.ids[0] < 0 or record.ids[-1] >= n):
            bad = record.ids[(record.ids < 0) | (record.ids >= n)]
            raise ValueError(f"cannot exclude id(s) {bad[:5].tolist()}: the source's ids are 0..{n - 1}")
        return record

    # -- reporting ------------------------------------------------------------------------
    def quarantine_report(self) -> list[dict]:
        """Every sample skipped so far under on_error="skip", in the order they were met."""
        return self._quarantine.report()

    def stats(self) -> dict:
        """What the loader measured about itself (``stats.py``), ``"handoff"``, ``"workers"``,
        ``"mode"`` and ``"prefetch"`` (those in use: an int, whatever was asked), under ``workers="auto"`` what it
        picked and why (``"auto"``: ``execution/auto.py``'s ``AutoChoice``; None until the first
        epoch starts), and with ``pack_to`` the pack's state (``"pack"``: ``state``, ``path``, ``error``,
        ``decoded`` under ``pack_decoded``)."""
        pack = {"pack": self._autopack.report()} if self._autopack is not None else {}
        execution = self._running_config.execution
        asked = self.config.execution.resolved(self._unset_workers).workers
        picked = {"auto": self._auto.as_dict() if self._auto is not None else None} if asked == AUTO else {}
        running = {
            "workers": execution.workers,
            "mode": execution.mode,
            "prefetch": execution.effective_prefetch * self._grouping.window_factor,
            "batches_per_task": self._grouping.in_use,
            "grouping": self._grouping.stopped or self._grouping.picked,
        }
        return {**self._stats.as_dict(), "handoff": self.handoff, **running, **picked, **pack}

    @property
    def handoff(self) -> str:
        """Who makes batches now: ``"workers"``, ``"inline"`` (the consumer: ``workers=0``, or
        batches cheaper to make than to hand over) or ``"deciding"`` (measuring both ways,
        ``execution/handoff.py``)."""
        if self._handoff.deciding:
            return "deciding"
        return "workers" if self._handoff.to_workers else "inline"

    # -- resume ---------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        """What a saved position depends on: the data (its size and identity), the plan and
        how orders are drawn (``ORDER_FORMAT``). The shard is kept apart (``"shard"``), so a
        merged state (``merge_states``) can name none."""
        read = self.config.read
        if self._source_identity is None:  # a fingerprint() may stat every file: once per loader
            self._source_identity = source_identity(self.source)
        return {
            "num_items": len(self.source),
            "source": self._source_identity,
            "batch_size": read.batch_size,
            "seed": int(read.seed),
            "sampler": repr(self.sampler),
            "order": ORDER_FORMAT,
            "last_batch": read.last_batch,
        }

    def state_dict(self) -> dict:
        """Where the loader stands: the next batch to hand out. JSON-serializable; the states of
        all shards of a run merge (``steadyfeed.merge_states``) into one for another shard count."""
        epoch, next_batch = self._cursor
        shard = self.config.sharding
        levels = self._remainder[1] if self._remainder and self._remainder[0] == epoch else []
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "next_batch": next_batch,
            "fingerprint": self._fingerprint(),
            "shard": {"index": shard.shard_index, "count": shard.shard_count},
            "order_length": len(self._plan(epoch).order),
            "remainder": {"epoch": epoch, "levels": levels} if levels else None,
            "excluded": self._exclusions.as_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; workers and mode may differ from the saving loader's, the
        data and the plan may not (a state saved on other data of the same length is refused).
        A state of one shard resumes that shard only; a merged one (``merge_states``) any shard.
        The saved exclusions are restored; ids this loader excluded that the state lacks are
        added as ``exclude()`` would add them at the saved position."""
        check_state_format(state)
        mine = self._fingerprint()
        diff = {k: (v, mine.get(k)) for k, v in state["fingerprint"].items() if mine.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: saved {a!r}, here {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"this state was saved by a loader with different data or a different plan ({detail})")
        self._check_shard(state.get("shard"))
        epoch, before = int(state["epoch"]), (self._remainder, self._cached_plan, self._exclusions)
        rest = state.get("remainder")
        self._remainder = (int(rest["epoch"]), list(rest["levels"])) if rest else None
        self._cached_plan = (None, None, None)
        try:
            saved = self._checked_exclusions(Exclusions.from_state(state.get("excluded")))
            start = epoch + (int(state["next_batch"]) > 0)
            own = Exclusions(
                self._exclusions.ids, np.maximum(self._exclusions.from_epoch, start), self._exclusions.reasons
            )
            self._exclusions = saved.merged(own)
            saved_length, length = state.get("order_length"), len(self._plan(epoch).order)
            if saved_length is not None and saved_length != length:
                raise ValueError(f"this state's epoch {epoch} has {saved_length} positions, here {length}")
            self.seek(epoch, int(state["next_batch"]))
        except BaseException:
            self._remainder, self._cached_plan, self._exclusions = before
            raise

    def _check_shard(self, saved: dict | None) -> None:
        shard = self.config.sharding
        if saved is None or (saved["index"], saved["count"]) == (shard.shard_index, shard.shard_count):
            return
        hint = (
            "; to resume on another number of shards, merge the states of all shards with "
            "steadyfeed.merge_states(states)"
            if saved["count"] != shard.shard_count
            else ""
        )
        raise ValueError(
            f"this state was saved by shard {saved['index']} of {saved['count']}, this loader is shard "
            f"{shard.shard_index} of {shard.shard_count}{hint}"
        )

    # -- frameworks (imported only when asked for) -------------------------------------
    def as_keras(
        self,
        x: str | Sequence[str] | Mapping[str, str] = "x",
        y: str | Sequence[str] | Mapping[str, str] | None = "y",
        sample_weight: str | None = None,
        *,
        steps_per_epoch: int | None = None,
        padding: str | None = None,
    ) -> KerasDataset:
        """A ``keras.utils.PyDataset`` for fit/evaluate/predict (the ``keras`` extra): one Keras
        epoch is one loader epoch, every sample once, in the loader's order and with its workers.
        ``x`` / ``y`` name a key, a tuple of keys or ``{input name: key}``; see
        ``steadyfeed.keras.KerasDataset`` for the arguments and guarantees."""
        from .integration.keras_dataset import KerasDataset

        return KerasDataset(
            self, x=x, y=y, sample_weight=sample_weight, steps_per_epoch=steps_per_epoch, padding=padding
        )

    def as_tf_dataset(
        self,
        x: str | Sequence[str] | Mapping[str, str] | None = None,
        y: str | Sequence[str] | Mapping[str, str] | None = None,
    ) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` over ``iter(self)`` (the ``tf`` extra): each iteration is the
        loader's batches from its cursor to the end of that epoch, each once, in its order;
        ``element_spec`` is exact (padded dimensions ``None``); never re-sharded by
        ``tf.distribute``. With ``x`` / ``y``, elements are ``(x, y)`` as ``as_keras`` gives them."""
        from .integration.tf_dataset import to_tf_dataset

        return to_tf_dataset(self, x=x, y=y)

    def as_torch(self) -> TorchBatches:
        """A ``torch.utils.data.IterableDataset`` of dicts of tensors (``torch.from_numpy``, no
        copy); ``iter(ds)`` is ``iter(loader)``. Use it directly or as ``DataLoader(ds,
        batch_size=None, num_workers=0)``: steadyfeed's workers are the workers."""
        from .integration.torch_dataset import TorchBatches

        return TorchBatches(self)

    # -- lifetime -------------------------------------------------------------------------
    def _shutdown_pool(self) -> None:
        _shutdown_pool(self.__dict__)

    def close(self) -> None:
        """Stop and join every worker, release shared memory, close the source."""
        self._closed = True
        try:
            if self._autopack is not None:
                self._autopack.stop()
            # called directly, not through the finalizer, which runs once: a close that a Ctrl-C
            # cut short is finished by the next close, or by the finalizer at collection
            _shutdown_pool(self.__dict__)
            self._finalizer.detach()
        finally:
            close_reader(self._reader, self.source)
            close_source(self.source)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except KeyboardInterrupt:  # a second Ctrl-C while closing after the first: one is enough
            if not isinstance(exc, KeyboardInterrupt):
                raise

    def __repr__(self) -> str:
        read, execution = self.config.read, self.config.execution
        picked = f" (picked {self._auto.workers} {self._auto.mode})" if self._auto is not None else ""
        return (
            f"Loader({self.source!r}, batch_size={read.batch_size}, workers={execution.workers!r}{picked}, "
            f"mode={execution.mode!r}, sampler={self.sampler!r})"
        )


def refuse_unsupported(source: Any, execution: ExecutionOptions) -> None:
    """Raise for a combination of source and execution that cannot work, saying what to use
    instead: ``mode="ray"`` without Ray, or a source (or one it wraps) whose
    ``unsupported(mode, workers)`` says why not (a Ray Dataset source in process mode)."""
    mode, workers = execution.mode, workers_count(execution.workers)  # "auto" asks again before picking processes
    if mode == "ray" and workers > 0 and importlib.util.find_spec("ray") is None:
        raise ModuleNotFoundError(
            "mode='ray' needs Ray: pip install 'steadyfeed[ray]', or use mode='thread' or mode='process'"
        )
    layer = source
    while layer is not None:
        check = getattr(layer, "unsupported", None)
        why = check(mode, workers) if callable(check) else None
        if why:
            raise ValueError(f"{layer!r} cannot be read with mode={mode!r}, workers={workers}: {why}")
        layer = layer.source if isinstance(layer, SourceWrapper) else None


def _nbytes(batch: Mapping[str, np.ndarray]) -> int:
    return sum(np.asarray(v).nbytes for v in batch.values())


def _shutdown_pool(state: dict) -> None:
    """Shut the loader's pool down (``_retire``). Module-level so the finalizer holds no
    reference to the loader itself."""
    pool, state["_pool"] = state.get("_pool"), None  # no longer the loader's: the next epoch starts a new one
    _retire(state, pool)


def _retire(state: dict, pool=None) -> None:
    """Shut ``pool`` down, and finish first the shutdowns a Ctrl-C cut short before (kept in
    ``state["_stopping"]`` until done): a third press, inside the kill of the workers that a
    second one had left, would otherwise leave the rest of them, and their shared memory, for
    good (process workers exit once told to stop; their segments are the consumer's to unlink)."""
    if pool is not None:
        state["_stopping"].append(pool)
    finish_each(state["_stopping"], methodcaller("shutdown"))


def check_state_format(state: dict) -> None:
    """Refuse, saying why, anything but a loader state of this format."""
    saved = state.get("format") if isinstance(state, dict) else None
    if saved in _OLD_FORMATS:
        raise ValueError(
            f"this state was saved by an older steadyfeed ({saved}: {_OLD_FORMATS[saved]}); this version draws "
            f"other orders ({STATE_FORMAT}, order {ORDER_FORMAT}), so the saved position would resume another "
            "order: restart the epoch instead (loader.seek(epoch))"
        )
    if saved != STATE_FORMAT:
        raise ValueError(f"not a steadyfeed loader state (format {saved!r}, expected {STATE_FORMAT!r})")


def source_identity(source: Any) -> dict:
    """The source's type and ``fingerprint()`` (or, without one, its repr less any memory
    address): two datasets of one length but different content or kind tell apart."""
    kind = type(source)
    fp = fingerprint(source)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "fingerprint": fp if fp is not None else re.sub(r" at 0x[0-9a-fA-F]+", "", repr(source)),
    }
