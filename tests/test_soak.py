"""The soak with faults, short (``benchmarks/soak.py`` runs it for 200 epochs): thread and
process mode while a chaos thread kills workers, makes samples raise and slows reads. Every
epoch exactly once minus the quarantined samples (each one made to raise, named, quarantined
once), and RSS, fds, threads, children and /dev/shm entries flat from epoch 10 to the end.

The chaos is paced by batches delivered, not by the clock, so what it does is the same on a
slow machine; every assertion is about outcomes."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import soak  # noqa: E402  (process workers import it too, by this path)

EPOCHS = soak.FLAT_FROM + 12


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_short_soak_with_faults_is_exactly_once_and_flat(mode, no_leaks):
    result = soak.soak(
        mode,
        epochs=EPOCHS,
        n=240,
        width=16,
        batch_size=12,
        workers=2,
        seed=19,
        every=3,
        kill_every=40 if mode == "thread" else 80,
    )
    assert result.problems == []
    assert {k: f for k, f in result.flat.items() if not f["flat"]} == {}
    # the chaos happened: workers killed (new processes started), samples made to raise and quarantined
    assert result.kills >= 1 and result.armed >= 1 and result.quarantined == result.armed
    if mode == "process":
        assert result.worker_pids > 2


def test_the_soak_checks_catch_a_lost_a_repeated_and_an_unnamed_sample():
    named = {"sample_id": 3, "epoch": 0, "location": "chaos sample 3 of 5", "message": "boom", "error_type": "E"}
    assert soak._check_epoch(0, np.array([0, 1, 2, 4]), [named], 5) == []
    assert soak._check_epoch(0, np.array([0, 1, 2]), [named], 5)  # 4 lost
    assert soak._check_epoch(0, np.array([0, 1, 1, 2, 4]), [named], 5)  # 1 twice
    assert soak._check_epoch(0, np.array([0, 1, 2, 4]), [{**named, "location": None}], 5)
    assert soak._check_epoch(0, np.array([0, 1, 2, 3, 4]), [named], 5)  # quarantined, yet delivered


def test_flatness_sees_growth_after_epoch_10():
    steady = {"rss": [100] * 20, "fds": [7, 9] * 10}
    assert all(f["flat"] for f in soak.flatness(steady, rss_slack=10).values())
    leaking = {"rss": [100] * 15 + [200] * 5, "fds": list(range(20))}
    assert not any(f["flat"] for f in soak.flatness(leaking, rss_slack=10).values())
