"""Process mode's pipe threads (execution/sender.py, receiver.py): tasks are written and results
taken in and copied out of shared memory off the consumer's thread, and a failure in either
surfaces instead of hanging."""

import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest
from helpers import assert_paired, paired_source

from steadyfeed import Loader
from steadyfeed.execution import receiver, shm
from steadyfeed.execution.task import BatchTask

pytestmark = pytest.mark.timeout(60)


def test_batches_are_copied_out_of_shared_memory_off_the_consumers_thread(monkeypatch, no_leaks):
    copied_in = []
    receive = shm.ConsumerSlots.receive

    def recording(self, name, layout):
        copied_in.append(threading.current_thread().name)
        return receive(self, name, layout)

    monkeypatch.setattr(shm.ConsumerSlots, "receive", recording)
    with Loader(paired_source(64), 4, workers=2, mode="process", with_ids=True, inline_when_faster=False) as loader:
        batches = list(loader)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(64))
    for batch in batches:
        assert_paired(batch)
    assert copied_in and set(copied_in) == {"steadyfeed-receiver"}


def test_a_failing_receiver_raises_in_the_consumer_instead_of_hanging(monkeypatch, no_leaks):
    def broken(self, result):
        raise KeyError("a bug in the receiver")

    monkeypatch.setattr(receiver.ResultReceiver, "_copy_out", broken)
    with Loader(paired_source(64), 4, workers=2, mode="process", inline_when_faster=False) as loader:
        with pytest.raises(RuntimeError, match="(?s)sends tasks or receives results failed.*a bug in the receiver"):
            list(loader)


def test_tasks_are_written_to_the_workers_off_the_consumers_thread(monkeypatch, no_leaks):
    sent_from = []
    send = Connection.send

    def recording(self, obj):
        if isinstance(obj, BatchTask):
            sent_from.append(threading.current_thread().name)
        return send(self, obj)

    monkeypatch.setattr(Connection, "send", recording)
    with Loader(paired_source(64), 4, workers=2, mode="process", inline_when_faster=False) as loader:
        assert len(list(loader)) == 16
    assert len(sent_from) >= 16 and set(sent_from) == {"steadyfeed-sender"}


def test_a_failing_sender_raises_in_the_consumer_instead_of_hanging(monkeypatch, no_leaks):
    send = Connection.send

    def broken(self, obj):
        if isinstance(obj, BatchTask):
            raise KeyError("a bug in the sender")
        return send(self, obj)

    monkeypatch.setattr(Connection, "send", broken)
    with Loader(paired_source(64), 4, workers=2, mode="process", inline_when_faster=False) as loader:
        with pytest.raises(RuntimeError, match="(?s)sends tasks or receives results failed.*a bug in the sender"):
            list(loader)
