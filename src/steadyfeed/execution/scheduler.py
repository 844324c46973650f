"""Runs one epoch's plan on a pool and hands back batches strictly in plan order.

Bounded: at most ``prefetch`` batches are submitted, running or finished-but-not-yet-
taken at any time, so memory stays bounded however slow the consumer is; a
:class:`ByteBudget` (``max_inflight_bytes``) bounds their bytes as well, for batches whose
size varies.

Fault handling lives here, in one place: when a worker is lost, the sample it was
on is charged one attempt (and fails for good past ``retries``), and every task the
worker held is re-run on a fresh worker without the failed samples. Deaths that no
sample can be blamed for are bounded too, so a pool whose workers keep dying raises
instead of respawning forever.

A task may hold several consecutive batches (``grouping.py``, ``batches_per_task``): they
are submitted together and cut apart when their result arrives, or, when it brings anything
but rows, made again one by one. Every batch is still one ``_Batch`` here, counted in the
window as one, so nothing above this module knows.

Who makes each batch is the ``handoff``'s call (``handoff.py``): while it says
``to_workers`` is False, no new task goes to the pool and the consumer makes the next
batch itself (``pool.run_here``) once the batches already in flight have arrived. A
batch whose worker was lost always goes back to a worker: a sample that kills its
process must never run in the consumer's.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field, replace

from ..errors import WorkerDied
from ..sampling.plan import BatchSpec
from .grouping import Grouping, member_at, mergeable, merged, split
from .handoff import work_seconds
from .protocol import Done, Event, Lost, Pool
from .task import BatchTask, Disagreement, Running, SampleFailure, Stage

POLL_SECONDS = 0.5


@dataclass
class Outcome:
    spec: BatchSpec
    arrays: dict | None
    failures: list[SampleFailure]
    timings: dict = field(default_factory=dict)
    disagreement: Disagreement | None = None  # its samples read fine but cannot be collated


@dataclass
class _Batch:
    spec: BatchSpec
    task: BatchTask | None = None  # its latest task: None until first submitted
    lost_failures: list[SampleFailure] = field(default_factory=list)
    blameless_deaths: int = 0
    lost: bool = False  # a worker holding it was lost: it stays with the workers


def batch_bytes(arrays: dict | None) -> int:
    return 0 if arrays is None else sum(int(a.nbytes) for a in arrays.values())


class ByteBudget:
    """``max_inflight_bytes``: whether one more batch may join the window (planned, being made
    or ready), by bytes. Ready batches count as what they hold; the others, whose size is not
    known yet, each as the largest batch made so far (learnt from results, kept across epochs).

    Guarantees: the window is never left empty (a batch larger than the limit is still made,
    alone), so nothing waits forever; until a first batch has been measured, batches are made
    one at a time; once the largest batch has been seen, the bytes of the window stay within
    ``limit`` (or one batch). A batch larger than every batch before can exceed its share by
    its excess, once. ``limit=None``: no bound."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.largest: int | None = None

    def learn(self, nbytes: int) -> bool:
        """Record a batch made; True when it is the first measured (the window may grow now)."""
        first = self.largest is None and nbytes > 0
        if nbytes > 0:
            self.largest = max(self.largest or 0, nbytes)
        return first

    def admits(self, window_empty: bool, ready_bytes: int, not_ready: int) -> bool:
        if self.limit is None or window_empty:
            return True
        if self.largest is None:
            return False
        return ready_bytes + (not_ready + 1) * self.largest <= self.limit


class EpochRun:
    def __init__(
        self,
        pool: Pool,
        plan: list[BatchSpec],
        *,
        epoch: int,
        start: int,
        prefetch: int,
        retries: int,
        stop_on_failure: bool,
        task_ids: itertools.count,
        max_blameless_deaths: int,
        stats,
        handoff,
        budget: ByteBudget | None = None,
        grouping: Grouping | None = None,
    ):
        self.pool, self.plan, self.epoch = pool, plan, epoch
        self.budget = budget if budget is not None else ByteBudget()
        self.grouping = grouping if grouping is not None else Grouping()
        self._groups: dict[int, list[int]] = {}  # task id of a task of several batches -> their indices
        self.handoff = handoff
        self.prefetch, self.retries, self.stop_on_failure = prefetch, retries, stop_on_failure
        self.task_ids = task_ids
        self.max_blameless_deaths = max_blameless_deaths
        self.next_to_plan = start
        self.next_to_yield = start
        self.batches: dict[int, _Batch] = {}
        self.ready: dict[int, Outcome] = {}
        self.to_submit: list[int] = []  # heap of batch indices: the oldest batch goes first
        self.deaths_since_progress = 0
        self.stats = stats  # LoaderStats: consumer wait time and queue fill are measured here

    def __iter__(self):
        self.handoff.new_epoch(len(self.plan) - self.next_to_yield)
        last_yield = None
        self._start()
        while self.next_to_yield < len(self.plan):
            entered = time.perf_counter()
            if self._in_flight():  # keep workers busy even when the next batch is ready
                for event in self.pool.drain():
                    self._handle(event)
            self._submit_ready_tasks()
            t0 = time.perf_counter()
            made_here = False
            while self.next_to_yield not in self.ready:
                if self._next_is_mine():
                    self._make_here()
                    made_here = True
                    continue
                for event in self.pool.wait(POLL_SECONDS):
                    self._handle(event)
                self._submit_ready_tasks()
            now = time.perf_counter()
            self.stats.wait_seconds += now - t0
            self.stats.inline_batches += made_here
            self.stats.record_fill(len(self.ready))
            outcome = self.ready.pop(self.next_to_yield)
            del self.batches[self.next_to_yield]
            self.next_to_yield += 1
            # the batch taken frees a place in the window: a worker starts on it while the
            # consumer works, not when it comes back (so a slow consumer finds prefetch ready)
            self._fill_window()
            self._submit_ready_tasks()
            if last_yield is not None:  # the consumer's time in the loader includes that submit
                self.handoff.record(now - last_yield, time.perf_counter() - entered, outcome.timings, made_here)
            last_yield = now
            yield outcome

    def _in_flight(self) -> bool:
        return len(self.batches) > len(self.ready) + len(self.to_submit)

    def _next_is_mine(self) -> bool:
        """The consumer makes the next batch when no worker has it and it will not go to one."""
        index = self.next_to_yield
        return bool(self.to_submit) and self.to_submit[0] == index and not self._to_worker(index)

    def _to_worker(self, index: int) -> bool:
        return self.handoff.to_workers or self.batches[index].lost

    def _make_here(self) -> None:
        batch = self._next_task()
        assert batch.task is not None  # made by _next_task
        self._handle(Done(self.pool.run_here(batch.task)))

    def _next_task(self) -> _Batch:
        """The oldest batch to submit, with a fresh task id (a re-run keeps what its last task learnt)."""
        batch = self.batches[heapq.heappop(self.to_submit)]
        task_id = next(self.task_ids)
        if batch.task is None:
            batch.task = BatchTask(task_id, self.epoch, batch.spec)
        else:
            batch.task = replace(batch.task, task_id=task_id, shm_name=None)
        return batch

    def _within_budget(self) -> bool:
        """Room in the window for one more batch by bytes (the budget; by count, ``_fill_window``)."""
        if self.budget.limit is None:
            return True
        ready_bytes = sum(batch_bytes(outcome.arrays) for outcome in self.ready.values())
        return self.budget.admits(not self.batches, ready_bytes, len(self.batches) - len(self.ready))

    def _start(self) -> None:
        """Fill the window (and again as each batch is handed out), the idle workers' first
        tasks submitted first: planning the whole window before any (a few hundred batches:
        ~1.7 ms for 249 batches of npy pairs) left every worker idle that long at each epoch's
        start."""
        first = self.pool.idle_workers() * self.grouping.size_at(len(self.plan) - self.next_to_plan)
        if first:
            self._fill_window(limit=first)
            self._submit_ready_tasks()
        self._fill_window()
        self._submit_ready_tasks()

    def _fill_window(self, limit: int | None = None) -> None:
        """Admit batches while the window has room (at most ``limit`` of them): ``prefetch``
        batches (times ``grouping.window_factor``) from the next to hand out, within the budget."""
        stop = min(len(self.plan), self.next_to_yield + self.prefetch * self.grouping.window_factor)
        if limit is not None:
            stop = min(stop, self.next_to_plan + limit)
        while self.next_to_plan < stop and self._within_budget():
            index = self.next_to_plan
            spec = self.plan[index]
            self.batches[index] = _Batch(spec)
            heapq.heappush(self.to_submit, index)
            self.next_to_plan += 1

    def _submit_ready_tasks(self) -> None:
        while self.to_submit and self._to_worker(self.to_submit[0]) and self.pool.free_slots() > 0:
            group = self._group_at_front()
            if group is None:  # a group still filling: the batches it waits for join as the consumer takes others
                return
            task = self._next_task().task if len(group) == 1 else self._group_task(group)
            assert task is not None  # made by _next_task
            self.pool.submit(task)

    def _fresh(self, index: int) -> bool:
        """Batch ``index`` is in the window, never submitted, and may share a task."""
        batch = self.batches.get(index)
        return batch is not None and batch.task is None and not batch.lost and mergeable(batch.spec)

    def _group_at_front(self) -> list[int] | None:
        """The batches the next task holds: the oldest to submit and, while grouping, the fresh
        batches after it, up to ``grouping.size_at`` (smaller at the epoch's end). A group short
        of that size waits for more (None) unless the plan has no more, the consumer waits for
        its first batch, or a worker has nothing to do while fewer than a task's worth of batches
        are ready: then it goes as it is. A consumer slower than its workers keeps the window full
        of ready batches and frees one place at a time; sent at once to an idle worker, each
        would be a task of one batch (2 processes, HDF5 rows, a 1 ms training step: tasks of
        one, and half the batches copied out of slots instead of lent), while the ready ones
        cover the wait for a whole task."""
        first = self.to_submit[0]
        if not self.grouping.active or not self._fresh(first):
            return [first]
        size = self.grouping.size_at(len(self.plan) - first)
        # the batches planned after it bound the group: a consumer that takes ready batches while
        # a group fills asks at each, and walking the group then cost it ~10 us a batch (HDF5 rows)
        if self.next_to_plan - first < size and not self._goes_short(first, size):
            return None
        group = [first]
        while len(group) < size and self._fresh(group[-1] + 1):
            group.append(group[-1] + 1)
        return group if len(group) == size or self._goes_short(first, size) else None

    def _goes_short(self, first: int, size: int) -> bool:
        """Whether a group from ``first`` short of ``size`` batches goes as it is (``_group_at_front``)."""
        if self.next_to_plan >= len(self.plan) or first == self.next_to_yield:
            return True
        return self.pool.idle_workers() > 0 and len(self.ready) < size

    def _group_task(self, group: list[int]) -> BatchTask:
        """One task for the fresh batches ``group`` (the oldest in ``to_submit``)."""
        for index in group:
            assert heapq.heappop(self.to_submit) == index  # the smallest: every index between is in the group
        specs = [self.batches[i].spec for i in group]
        task = BatchTask(next(self.task_ids), self.epoch, merged(specs), batches=len(group))
        for index in group:
            self.batches[index].task = task
        self._groups[task.task_id] = group
        return task

    def _handle(self, event: Event) -> None:
        if isinstance(event, Done):
            self.deaths_since_progress = 0
            result = event.result
            batch = self.batches.get(result.batch_index)
            if batch is None or batch.task is None or batch.task.task_id != result.task_id:
                return  # a stale result of a task that was already re-run
            group = self._groups.pop(result.task_id, None)
            if group is not None:
                self._ungroup(group, result)
                return
            failures = sorted([*result.failures, *batch.lost_failures], key=lambda f: f.position)
            self.ready[result.batch_index] = Outcome(
                batch.spec, result.arrays, failures, dict(result.timings), result.disagreement
            )
            nbytes = batch_bytes(result.arrays)
            if self.grouping.learning and result.arrays is not None and not failures:
                self.grouping.learn(work_seconds(result.timings), nbytes)
            if self.budget.learn(nbytes):
                self._fill_window()  # the first size known: the window may hold more than one batch now
        else:
            self._handle_lost(event)

    def _ungroup(self, group: list[int], result) -> None:
        """A group's result: cut into its batches' outcomes when it brought every row; else each
        batch is made again alone, its samples that failed for good kept failed (``grouping.py``)."""
        specs = [self.batches[i].spec for i in group]
        if result.arrays is not None and not result.failures and result.disagreement is None:
            timings = {stage: seconds / len(group) for stage, seconds in result.timings.items()}
            batches = split(result.arrays, specs)
            for index, spec, arrays in zip(group, specs, batches):
                self.ready[index] = Outcome(spec, arrays, [], dict(timings))
            # the largest of them teaches the budget what each would (a batch's bytes are its rows')
            largest = max(range(len(specs)), key=lambda k: len(specs[k].ids))
            if self.budget.learn(batch_bytes(batches[largest])):
                self._fill_window()
            return
        if result.disagreement is not None:
            self.grouping.stopped = (
                f"the samples of batches {group[0]}..{group[-1]} of epoch {self.epoch} cannot be collated "
                "together: each batch is made alone from now on"
            )
        final: dict[int, list[SampleFailure]] = {}
        for failure in result.failures:
            k, position = member_at(specs, failure.position)
            final.setdefault(k, []).append(replace(failure, position=position))
        for k, index in enumerate(group):
            batch = self.batches[index]
            failed = final.get(k, [])
            batch.task = BatchTask(-1, self.epoch, batch.spec, excluded=frozenset(f.position for f in failed))
            batch.lost_failures.extend(failed)
            self._requeue(index, batch)

    def _requeue(self, index: int, batch: _Batch) -> None:
        """Batch ``index`` is to be made again; under ``on_error="raise"`` one with a sample
        failed for good is not: it raises as it is."""
        if self.stop_on_failure and batch.lost_failures:
            self.ready[index] = Outcome(batch.spec, None, list(batch.lost_failures))
        else:
            heapq.heappush(self.to_submit, index)

    def _handle_lost(self, event: Lost) -> None:
        self.handoff.pin_to_workers()
        self.deaths_since_progress += 1
        if self.deaths_since_progress > self.max_blameless_deaths:
            raise WorkerDied(
                f"{self.deaths_since_progress} workers were lost in a row without finishing a batch; "
                f"last: {event.detail}. Check the workers' stderr (e.g. the source or transform fails to "
                "unpickle or import in a fresh process).",
                sample_id=-1,
                epoch=self.epoch,
                batch_index=self.next_to_yield,
                attempts=0,
                error_type="WorkerDied",
            )
        for task in event.tasks:
            batch = self.batches.get(task.spec.index)
            if batch is None or batch.task is None or batch.task.task_id != task.task_id:
                continue
            running = event.running if event.running is not None and event.running.task_id == task.task_id else None
            for index, position in self._lost_batches(task, running):
                batch = self.batches[index]
                batch.lost = True
                if position is not None:
                    self._charge(batch, position, event)
                self._requeue(index, batch)

    def _lost_batches(self, task: BatchTask, running: Running | None) -> list[tuple[int, int | Stage | None]]:
        """The batches of a lost ``task``, each with where the worker was in it (None: not in it).
        A group's batches each get a task of their own, so the death is charged to one of them."""
        group = self._groups.pop(task.task_id, None)
        if group is None:
            return [(task.spec.index, None if running is None else running.position)]
        specs = [self.batches[i].spec for i in group]
        for index in group:
            self.batches[index].task = BatchTask(-1, self.epoch, self.batches[index].spec)
        where: list[int | Stage | None] = [None] * len(group)
        if running is not None and running.position is Stage.READING_BATCH:
            where = [Stage.READING_BATCH] * len(group)  # read together: each is read sample by sample next
        elif running is not None and running.position is Stage.COLLATING:
            where[0] = Stage.COLLATING
        elif running is not None:
            k, position = member_at(specs, running.position)
            where[k] = position
        return list(zip(group, where))

    def _charge(self, batch: _Batch, position: int | Stage, event: Lost) -> None:
        """Blame the lost attempt on the sample the worker was on."""
        task = batch.task
        assert task is not None  # a worker lost it: it was submitted
        if position is Stage.READING_BATCH:
            batch.task = replace(task, batched_read=False)  # next time one by one, so a death names its sample
            return
        if position is Stage.COLLATING:
            batch.blameless_deaths += 1
            if batch.blameless_deaths > self.retries:
                raise WorkerDied(
                    f"worker lost while collating batch {task.spec.index} of epoch {self.epoch}: {event.detail}",
                    sample_id=-1,
                    epoch=self.epoch,
                    batch_index=task.spec.index,
                    attempts=batch.blameless_deaths,
                    error_type="WorkerDied",
                )
            return
        attempts = task.prior_attempts.get(position, 0) + 1
        if attempts <= self.retries:
            batch.task = replace(task, prior_attempts={**task.prior_attempts, position: attempts})
            return
        failure = SampleFailure(
            position=position,
            sample_id=int(task.spec.ids[position]),
            attempts=attempts,
            error_type="SampleTimeout" if event.cause == "timeout" else "WorkerDied",
            message=event.detail,
            traceback="",
            cause=event.cause,
        )
        batch.lost_failures.append(failure)
        batch.task = replace(task, excluded=task.excluded | {position})
