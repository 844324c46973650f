"""loader.stats(): the loader's own measurements, cheap enough to leave on."""

import time

import pytest
from helpers import paired_source

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(60)


def slow(sample, rng):
    time.sleep(0.002)
    return sample


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_stats_count_what_was_delivered(workers, mode, no_leaks):
    with Loader(paired_source(200), 16, workers=workers, mode=mode, transform=slow, prefetch=3) as loader:
        list(loader)
        stats = loader.stats()
    assert stats["batches"] == 13 and stats["samples"] == 200
    assert stats["stage_seconds"]["transform"] >= 200 * 0.002 * 0.9  # summed over workers
    assert stats["first_batch_seconds"] is not None and stats["first_batch_seconds"] > 0
    assert len(stats["queue_fill_timeline"]) == 13
    assert all(0 <= ready <= 3 for _, ready in stats["queue_fill_timeline"])  # never above prefetch
    assert (stats["stage_seconds"]["transport"] > 0) == (mode == "process")


def test_a_slow_consumer_sees_a_full_queue(no_leaks):
    with Loader(paired_source(200), 8, workers=2, prefetch=4) as loader:
        for _ in loader:
            time.sleep(0.01)
        stats = loader.stats()
    assert stats["queue_fill_mean"] > 2  # producers outrun a consumer 10 ms a batch: the queue fills
    assert stats["queue_fill_max"] == 4  # prefetch, never more
