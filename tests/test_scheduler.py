"""EpochRun driven by a scripted pool: order, re-runs, charges and bounds, with no real worker.

The fake pool speaks the pool protocol (``execution/protocol.py``) and does what each test
scripts: finish tasks in any order, lose a worker at a given position or stage, or hand
back a stale result. So the scheduler's fault bookkeeping is tested on its own, exactly,
independent of threads, processes and timing.
"""

import numpy as np
import pytest
from helpers import ScriptedPool, epoch_run

from steadyfeed.errors import WorkerDied
from steadyfeed.execution.grouping import Grouping
from steadyfeed.execution.protocol import Done, Lost
from steadyfeed.execution.task import BatchResult, Stage


def run(pool, n=24, batch_size=4, retries=0, stop_on_failure=False, prefetch=3, max_blameless_deaths=3):
    epoch = epoch_run(
        pool,
        n,
        batch_size,
        prefetch=prefetch,
        retries=retries,
        stop_on_failure=stop_on_failure,
        max_blameless_deaths=max_blameless_deaths,
    )
    return list(epoch)


def ids(outcomes):
    return [o.arrays["id"].tolist() for o in outcomes if o.arrays is not None]


def once(predicate, answer):
    """A script that gives ``answer`` the first time ``predicate(task)`` holds, then finishes tasks."""
    used = []

    def script(task):
        if not used and predicate(task):
            used.append(task)
            return answer
        return None

    return script


@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_batches_come_out_in_plan_order_whatever_order_they_finish(order):
    pool = ScriptedPool(order=order)
    outcomes = run(pool, prefetch=3)
    assert [o.spec.index for o in outcomes] == list(range(6))
    assert ids(outcomes) == [list(range(k, k + 4)) for k in range(0, 24, 4)]
    assert pool.max_in_flight <= 3  # the window: never more than prefetch batches out


class PlanWatchingPool(ScriptedPool):
    """Records, at each submit, how many batches its run (``run``) had planned (put in its window)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.run, self.planned = None, []

    def submit(self, task):
        self.planned.append(self.run.next_to_plan)
        super().submit(task)


@pytest.mark.parametrize("size", [1, 4])
def test_the_idle_workers_first_tasks_go_before_the_rest_of_the_window_is_planned(size):
    """At an epoch's start the idle workers' first tasks are planned and submitted first, then
    the rest of the window: planning a whole window first (249 batches of npy pairs, ~1.7 ms)
    left every worker idle that long at each epoch's start."""
    pool = PlanWatchingPool(workers=2)
    grouping = Grouping(size=size, workers=2, grows_window=True)
    pool.run = epoch_run(pool, 400, 4, prefetch=10, grouping=grouping)
    outcomes = list(pool.run)
    assert pool.planned[:2] == [2 * size, 2 * size]  # a task for each idle worker, nothing more
    assert pool.planned[2] == 10 * size  # then the whole window
    assert ids(outcomes) == [list(range(k, k + 4)) for k in range(0, 400, 4)]


def test_a_lost_worker_charges_its_sample_and_reruns_the_batch_within_retries():
    pool = ScriptedPool(once(lambda t: t.spec.index == 2, (1, "died")))
    outcomes = run(pool, retries=1)
    assert ids(outcomes)[2] == [8, 9, 10, 11] and not any(o.failures for o in outcomes)
    reruns = [t for t in pool.submitted if t.spec.index == 2]
    assert len(reruns) == 2 and reruns[1].prior_attempts == {1: 1} and reruns[1].task_id != reruns[0].task_id


@pytest.mark.parametrize("cause,error_type", [("died", "WorkerDied"), ("timeout", "SampleTimeout")])
def test_past_retries_the_sample_fails_for_good_and_the_rest_of_its_batch_survives(cause, error_type):
    pool = ScriptedPool(once(lambda t: t.spec.index == 1, (2, cause)))
    outcomes = run(pool, retries=0)
    (failure,) = outcomes[1].failures
    assert (failure.sample_id, failure.position, failure.attempts, failure.error_type, failure.cause) == (
        6,
        2,
        1,
        error_type,
        cause,
    )
    assert ids(outcomes)[1] == [4, 5, 7]  # re-run without the failed sample
    assert [t.excluded for t in pool.submitted if t.spec.index == 1] == [frozenset(), frozenset({2})]


def test_under_raise_a_sample_lost_for_good_fails_its_batch_without_a_rerun():
    pool = ScriptedPool(once(lambda t: t.spec.index == 1, (0, "died")))
    outcomes = run(pool, retries=0, stop_on_failure=True)
    assert outcomes[1].arrays is None and [f.sample_id for f in outcomes[1].failures] == [4]
    assert len([t for t in pool.submitted if t.spec.index == 1]) == 1


def test_a_death_inside_a_batched_read_blames_no_sample_and_reads_one_by_one_next():
    pool = ScriptedPool(once(lambda t: t.spec.index == 0, (Stage.READING_BATCH, "died")))
    outcomes = run(pool, retries=0)
    assert not any(o.failures for o in outcomes) and ids(outcomes)[0] == [0, 1, 2, 3]
    first, second = [t for t in pool.submitted if t.spec.index == 0]
    assert first.batched_read and not second.batched_read and second.prior_attempts == {}


def test_a_death_while_collating_is_retried_then_raised():
    pool = ScriptedPool(once(lambda t: t.spec.index == 3, (Stage.COLLATING, "died")))
    assert ids(run(pool, retries=1))[3] == [12, 13, 14, 15]
    with pytest.raises(WorkerDied, match="while collating batch 3"):
        run(ScriptedPool(once(lambda t: t.spec.index == 3, (Stage.COLLATING, "died"))), retries=0)


def test_workers_that_keep_dying_without_progress_raise_instead_of_respawning_forever():
    pool = ScriptedPool(lambda task: (Stage.READING_BATCH, "died"))
    with pytest.raises(WorkerDied, match="4 workers were lost in a row"):
        run(pool, max_blameless_deaths=3)


def test_a_stale_result_of_a_rerun_task_is_ignored():
    """A worker reported lost may still deliver its old task; only the re-run's result counts."""

    class LateResult(ScriptedPool):
        def wait(self, timeout):
            events = super().wait(timeout)
            lost = [e for e in events if isinstance(e, Lost)]
            stale = [
                Done(BatchResult(t.task_id, t.spec.index, {"id": np.array([-7])}, (), {}))
                for e in lost
                for t in e.tasks
            ]
            return events + stale

    outcomes = run(LateResult(once(lambda t: t.spec.index == 2, (0, "died"))), retries=1)
    assert ids(outcomes)[2] == [8, 9, 10, 11]


class ShrinkingPool(ScriptedPool):
    """Like Ray losing a node: after the first loss no worker runs for ``idle_waits`` waits (the
    replacement is not placed yet: nothing can be submitted, nothing is in flight), then one does."""

    def __init__(self, script, idle_waits):
        super().__init__(script, capacity=4)
        self.idle_waits, self.after_loss = idle_waits, None  # index in submitted where the loss was seen

    def free_slots(self):
        if self.after_loss is None:
            return super().free_slots()
        return 0 if self.idle_waits else 1 - len(self.pending)

    def wait(self, timeout):
        if self.after_loss is not None and self.idle_waits and not self.pending:
            self.idle_waits -= 1
            return []
        events = super().wait(timeout)
        if self.after_loss is None and any(isinstance(e, Lost) for e in events):
            self.after_loss = len(self.submitted)
        return events


def test_a_batch_lost_with_no_sample_to_blame_reruns_first_on_the_workers_left():
    """No worker for a while, then one: the epoch waits (no busy loop, no error), the lost batch
    is the next task submitted, nothing is charged (retries=0), and order and content hold."""
    pool = ShrinkingPool(once(lambda t: t.spec.index == 1, (None, "died")), idle_waits=3)
    outcomes = run(pool, retries=0, prefetch=4)
    assert ids(outcomes) == [list(range(k, k + 4)) for k in range(0, 24, 4)] and not any(o.failures for o in outcomes)
    assert pool.idle_waits == 0
    rerun = pool.submitted[pool.after_loss]
    assert rerun.spec.index == 1 and rerun.prior_attempts == {} and rerun.excluded == frozenset()
