"""Process mode's receiver thread (execution/receiver.py): results are taken in and copied out
of shared memory off the consumer's thread, and a failure there surfaces instead of hanging."""
import threading

import numpy as np
import pytest

from steadyfeed import Loader
from steadyfeed.execution import receiver, shm

from helpers import assert_paired, paired_source

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
        with pytest.raises(RuntimeError, match="(?s)thread receiving worker results failed.*a bug in the receiver"):
            list(loader)
