"""Pools (execution/pool.py): which worker gets a task."""

import os

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(60)


def with_maker(sample, rng):
    """The sample, with the process that made it."""
    return {**sample, "pid": np.int64(os.getpid())}


def test_process_tasks_go_round_idle_workers_rather_than_all_to_the_first(no_leaks):
    """prefetch=1: one batch at a time, so every worker is idle at every submit. Each batch
    goes to the worker whose last task is oldest: they take turns, whatever their speeds (a
    worker lends only a few batches at once; one worker making them all would copy the rest)."""
    options = dict(workers=3, mode="process", prefetch=1, inline_when_faster=False)
    with Loader(paired_source(48), 4, transform=with_maker, with_ids=True, **options) as loader:
        batches = list(loader.epoch(0))
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]), np.arange(48))
    makers = [int(b["pid"][0]) for b in batches]
    assert all(len(set(b["pid"].tolist())) == 1 for b in batches)  # a batch is one worker's
    assert len(set(makers)) == 3 and makers == makers[:3] * 4  # the same three in turn
