"""A slow consumer over large batches: memory stays within prefetch x batch bytes plus a constant."""

import os
import threading
import time

import psutil
import pytest
from helpers import BigSource

from steadyfeed import Loader
from steadyfeed.execution import shm

pytestmark = pytest.mark.timeout(120)

SAMPLE_BYTES = 256 * 1024
BATCH = 16  # 4 MiB batches
BATCHES = 60  # 240 MiB if everything were buffered
SLACK = 48 * 2**20


def our_shm_bytes():
    if not os.path.isdir("/dev/shm"):
        return 0
    mine = f"{shm.PREFIX}{os.getpid():x}"
    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(mine):
            try:
                total += os.stat(f"/dev/shm/{name}").st_size
            except FileNotFoundError:
                pass
    return total


class PeakSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self._stop_flag = 0, threading.Event()

    def run(self):
        me = psutil.Process()
        while not self._stop_flag.is_set():
            self.peak = max(self.peak, me.memory_info().rss + our_shm_bytes())
            time.sleep(0.005)

    def stop(self):
        self._stop_flag.set()
        self.join()
        return self.peak


@pytest.mark.parametrize("workers,mode", [(2, "thread"), (2, "process")])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_slow_consumer_keeps_memory_bounded(workers, mode, prefetch, no_leaks):
    batch_bytes = SAMPLE_BYTES * BATCH
    with Loader(
        BigSource(BATCH * BATCHES, SAMPLE_BYTES), BATCH, workers=workers, mode=mode, prefetch=prefetch
    ) as loader:
        baseline = psutil.Process().memory_info().rss
        sampler = PeakSampler()
        sampler.start()
        count = 0
        for batch in loader.epoch(0):
            count += 1
            del batch
            time.sleep(0.02)  # a slow training step
        peak = sampler.stop()
    assert count == BATCHES
    growth = peak - baseline
    # prefetch batches waiting, one being built per worker, one held by the consumer
    bound = (prefetch + workers + 1) * batch_bytes * 2 + SLACK
    assert growth < bound, f"grew {growth / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB"
    assert bound < BATCHES * batch_bytes  # the test could fail: buffering everything would exceed it
