"""Pools (execution/pool.py): which worker gets a task."""

import threading

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(60)


def test_tasks_go_round_idle_workers_rather_than_all_to_the_first(no_leaks):
    """prefetch=1: one batch at a time, so every worker is idle at every submit. Each batch
    goes to the worker whose last task is oldest: they take turns, whatever their speeds."""
    made_by: dict[int, str] = {}

    def record(sample, rng):
        made_by[int(sample["x"][0]) // 4] = threading.current_thread().name  # row i starts at 4 * i
        return sample

    source = paired_source(48)
    with Loader(source, 4, workers=3, mode="thread", prefetch=1, transform=record, with_ids=True) as loader:
        ids = np.concatenate([b["id"] for b in loader.epoch(0)])
    np.testing.assert_array_equal(ids, np.arange(48))
    by_batch = [made_by[4 * index] for index in range(12)]
    assert len(set(by_batch)) == 3
    assert by_batch == by_batch[:3] * 4  # the same three in turn
    assert all(made_by[i] == by_batch[i // 4] for i in range(48))
