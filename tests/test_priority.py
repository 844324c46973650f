"""Workers run below the consumer's CPU priority (``worker_niceness``), so the training loop
never queues behind them for a core or the GIL. Linux only: nice values are per thread there."""

import os
import sys
import threading

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import Loader
from steadyfeed.config import LoaderConfig

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's"),
]


class NicenessSource:
    """Each sample carries the nice value of the thread that read it."""

    def __init__(self, n):
        self.inner = paired_source(n)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return {**self.inner[i], "nice": np.int64(nice)}


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("niceness", [0, 5])
def test_workers_run_at_the_asked_niceness_and_the_consumer_keeps_its_own(mode, niceness, no_leaks):
    before = own_nice()
    with Loader(
        NicenessSource(24), 4, workers=2, mode=mode, worker_niceness=niceness, inline_when_faster=False
    ) as loader:
        seen = np.concatenate([b["nice"] for b in loader])
    assert set(seen.tolist()) == {min(19, before + niceness)}
    assert own_nice() == before


def test_batches_made_by_the_consumer_keep_its_priority():
    with Loader(NicenessSource(8), 4) as loader:
        assert set(np.concatenate([b["nice"] for b in loader]).tolist()) == {own_nice()}


@pytest.mark.parametrize("bad", [-1, 20, 2.5])
def test_niceness_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="worker_niceness"):
        LoaderConfig.build(batch_size=4, worker_niceness=bad)
