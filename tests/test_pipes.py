"""Process mode's pipes (execution/inbox.py, sender.py): the consumer's own thread writes tasks
and takes results in; a task too big to write without waiting goes through a thread, and no
task overtakes another; a failure of that thread surfaces instead of hanging."""

import os
import pickle
import threading
from multiprocessing import Pipe

import numpy as np
import pytest
from helpers import assert_paired, paired_source

from steadyfeed import Loader
from steadyfeed.execution import inbox, sender, shm
from steadyfeed.execution.task import BatchResult, BatchTask, ShippedResult
from steadyfeed.sampling.plan import BatchSpec

pytestmark = pytest.mark.timeout(60)


def task(task_id: int, rows: int) -> BatchTask:
    ids = np.arange(rows, dtype=np.int64)
    return BatchTask(task_id, 0, BatchSpec(task_id, ids, None, None, rows))


def test_the_consumers_thread_writes_tasks_and_takes_results_in(monkeypatch, no_leaks):
    taken_in, threads_seen = [], set()
    receive = shm.ConsumerSlots.receive

    def recording(self, name, layout, generation=0):
        taken_in.append(threading.current_thread().name)
        threads_seen.update(t.name for t in threading.enumerate())
        return receive(self, name, layout, generation)

    monkeypatch.setattr(shm.ConsumerSlots, "receive", recording)
    with Loader(paired_source(64), 4, workers=2, mode="process", with_ids=True, inline_when_faster=False) as loader:
        batches = list(loader)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(64))
    for batch in batches:
        assert_paired(batch)
    assert len(taken_in) == 16 and set(taken_in) == {threading.main_thread().name}
    assert not any(name.startswith("steadyfeed-") for name in threads_seen)  # no helper thread at all


def test_a_task_too_big_to_write_at_once_goes_through_the_thread_and_nothing_overtakes_it():
    ours, theirs = Pipe()
    writer = sender.TaskSender(niceness=0)
    pipe = writer.pipe_for(ours)
    try:
        small, big = task(0, 8), task(1, sender.DIRECT_BYTES // 8 + 1)  # 8 bytes an id: the big one cannot go direct
        writer.send(pipe, small)
        assert not any(t.name == "steadyfeed-sender" for t in threading.enumerate())  # written directly
        writer.send(pipe, big)
        writer.send(pipe, task(2, 8))  # small, but behind a queued one: through the thread too
        got = [theirs.recv() for _ in range(3)]  # the big one is read here while the thread writes it
        assert [t.task_id for t in got] == [0, 1, 2]
        np.testing.assert_array_equal(got[1].spec.ids, big.spec.ids)
        writer.forget(pipe)
        writer.check()
    finally:
        writer.stop()
        ours.close()
        theirs.close()


def test_a_pipe_forgotten_after_the_sender_stopped_is_closed_at_once():
    """A worker released after ``stop`` (a shutdown that a Ctrl-C cut short, finished later):
    its pipe's close, queued behind a thread that has ended, would never happen."""
    ours, theirs = Pipe()
    writer = sender.TaskSender(niceness=0)
    pipe = writer.pipe_for(ours)
    try:
        writer.send(pipe, task(0, sender.DIRECT_BYTES // 8 + 1))  # through the thread
        assert theirs.recv().task_id == 0
        writer.stop()
        writer.forget(pipe)
        assert pipe.closed
    finally:
        writer.stop()
        ours.close()
        theirs.close()


def test_batches_of_a_hundred_thousand_rows_by_pipe_arrive_exactly_once(no_leaks):
    """Each task names 100,000 ids (800 KB pickled, more than a pipe buffers) and each result
    carries its 2.4 MB batch through the same pipe. Written from the consumer's thread, a task
    would wait for a worker that waits for the consumer to read its result: the thread writes
    them, and the consumer goes on reading."""
    n, rows = 400_000, 100_000
    source = paired_source(n, width=1)
    with Loader(
        source, rows, workers=2, mode="process", transport="pipe", with_ids=True, inline_when_faster=False
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(n))


def test_a_failing_sender_thread_raises_in_the_consumer_instead_of_hanging(monkeypatch, no_leaks):
    monkeypatch.setattr(sender, "DIRECT_BYTES", 0)  # every task through the thread
    real = sender.Connection.send_bytes

    def broken(self, buf, *args):
        if threading.current_thread().name == "steadyfeed-sender":
            raise KeyError("a bug in the sender")
        return real(self, buf, *args)

    monkeypatch.setattr(sender.Connection, "send_bytes", broken)
    with Loader(paired_source(64), 4, workers=2, mode="process", inline_when_faster=False) as loader:
        with pytest.raises(RuntimeError, match="(?s)writes tasks to the workers failed.*a bug in the sender"):
            list(loader)


def test_a_failure_taking_a_result_in_raises_where_the_consumer_iterates(monkeypatch, no_leaks):
    def broken(self, shipped):
        raise KeyError("a bug taking a result in")

    monkeypatch.setattr(inbox.ResultInbox, "_take_out", broken)
    with Loader(paired_source(64), 4, workers=2, mode="process", inline_when_faster=False) as loader:
        with pytest.raises(KeyError, match="a bug taking a result in"):
            list(loader)


@pytest.mark.parametrize("sentinel_first", [False, True], ids=["pipe-then-exit", "exit-seen-first"])
def test_a_result_sent_before_the_worker_ended_is_taken_in_before_its_end(sentinel_first):
    """A worker that writes its result and exits: whichever of its pipe and its process
    sentinel the select lists first, the result comes through (not re-run), then its end."""
    box = inbox.ResultInbox(shm.ConsumerSlots())
    ours, theirs = Pipe()
    ended, exits = os.pipe()  # the sentinel: readable once the write end closes, as a process's on exit
    box.watch(7, ours, ended)
    try:
        if sentinel_first:
            os.close(exits)
        result = BatchResult(3, 0, {"x": np.arange(4)}, (), {})
        theirs.send_bytes(pickle.dumps(ShippedResult(result, None, None)))
        theirs.close()
        if not sentinel_first:
            os.close(exits)
        messages = box.collect(5.0)
        assert [(kind, wid) for kind, wid, _ in messages] == [("done", 7), ("died", 7)]
        np.testing.assert_array_equal(messages[0][2].arrays["x"], np.arange(4))
        assert box.collect(0) == []  # its handles are closed: nothing more from it
    finally:
        box.close()
        ours.close()
        os.close(ended)
