"""Every id exactly once per epoch (or the documented drop), always paired with its label."""

import math

import numpy as np
import pytest
from helpers import assert_paired, paired_source
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(120)


def run_epoch_ids(loader, epoch=0):
    ids = []
    for batch in loader.epoch(epoch):
        assert_paired(batch)
        ids.append(batch["id"])
    return np.concatenate(ids) if ids else np.zeros(0, np.int64), len(ids)


def expected_ids(n, batch_size, drop_last):
    kept = (n // batch_size) * batch_size if drop_last else n
    return kept, math.floor(n / batch_size) if drop_last else math.ceil(n / batch_size)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 10007])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers,mode", [(0, "thread"), (1, "thread"), (2, "thread"), (4, "thread")])
def test_exactly_once_threads(n, drop_last, workers, mode, no_leaks):
    batch_size = 64
    with Loader(
        paired_source(n),
        batch_size,
        shuffle=True,
        seed=3,
        workers=workers,
        mode=mode,
        last_batch="drop" if drop_last else "partial",
        with_ids=True,
    ) as loader:
        for epoch in (0, 1):
            ids, batches = run_epoch_ids(loader, epoch)
            kept, num_batches = expected_ids(n, batch_size, drop_last)
            assert batches == num_batches == len(loader)
            assert len(ids) == kept and len(np.unique(ids)) == kept
            assert ids.min(initial=0) >= 0 and ids.max(initial=0) < max(n, 1)


@pytest.mark.parametrize(
    "n,batch_size,drop_last", [(0, 8, False), (1, 8, False), (7, 3, True), (1000, 32, False), (10007, 256, True)]
)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_exactly_once_processes(n, batch_size, drop_last, workers, no_leaks):
    with Loader(
        paired_source(n),
        batch_size,
        shuffle=True,
        seed=5,
        workers=workers,
        mode="process",
        last_batch="drop" if drop_last else "partial",
        with_ids=True,
    ) as loader:
        ids, batches = run_epoch_ids(loader)
    kept, num_batches = expected_ids(n, batch_size, drop_last)
    assert batches == num_batches
    assert len(ids) == kept and len(np.unique(ids)) == kept


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 300),
    batch_size=st.integers(1, 40),
    workers=st.sampled_from([0, 1, 3]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
    prefetch=st.integers(1, 5),
)
def test_exactly_once_property(n, batch_size, workers, drop_last, shuffle, seed, prefetch):
    with Loader(
        paired_source(n),
        batch_size,
        shuffle=shuffle,
        seed=seed,
        workers=workers,
        prefetch=prefetch,
        last_batch="drop" if drop_last else "partial",
        with_ids=True,
    ) as loader:
        ids, batches = run_epoch_ids(loader)
    kept, num_batches = expected_ids(n, batch_size, drop_last)
    assert batches == num_batches
    assert sorted(ids.tolist()) == sorted(set(ids.tolist())) and len(ids) == kept
    if not shuffle:
        assert ids.tolist() == list(range(kept))


def test_iterating_the_loader_runs_successive_epochs():
    with Loader(paired_source(50), 8, shuffle=True, with_ids=True) as loader:
        first = np.concatenate([b["id"] for b in loader])
        second = np.concatenate([b["id"] for b in loader])
        assert sorted(first) == sorted(second) == list(range(50))
        assert not np.array_equal(first, second)  # a new epoch, a new order
        assert np.array_equal(first, np.concatenate([b["id"] for b in loader.epoch(0)]))


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_batches_are_fresh_arrays(workers, mode, no_leaks):
    """A held batch never changes later, and scribbling on it changes nothing else."""
    held, snapshots = [], []
    with Loader(paired_source(64), 8, workers=workers, mode=mode, with_ids=True) as loader:
        for batch in loader:
            assert_paired(batch)  # earlier scribbles did not leak into this batch
            held.append(batch)
            snapshots.append({k: v.copy() for k, v in batch.items()})
            batch["x"][...] = -1
            batch["y"][...] = -1
            snapshots[-1]["x"][...] = -1
            snapshots[-1]["y"][...] = -1
    for batch, snap in zip(held, snapshots):
        for key in snap:
            np.testing.assert_array_equal(batch[key], snap[key])


def test_peek_equals_the_iterated_batch_and_moves_nothing(no_leaks):
    from helpers import epoch_digest, noisy

    with Loader(paired_source(100), 16, shuffle=True, seed=2, transform=noisy, workers=2, with_ids=True) as loader:
        peeked = [loader.peek(i, epoch=1) for i in range(len(loader))]
        assert loader.state_dict()["epoch"] == 0 and loader._pool is None
        assert epoch_digest(peeked) == epoch_digest(loader.epoch(1))
        with pytest.raises(IndexError, match="out of range"):
            loader.peek(len(loader))
