"""Shards are disjoint, complete, give equal batch counts under drop/pad, and mask padding."""

import numpy as np
import pytest
from helpers import assert_paired, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(120)


def shard_batches(n, batch_size, shard_count, last_batch, seed=0, workers=0):
    out = []
    for r in range(shard_count):
        with Loader(
            paired_source(n),
            batch_size,
            shuffle=True,
            seed=seed,
            shard_index=r,
            shard_count=shard_count,
            last_batch=last_batch,
            with_ids=True,
            workers=workers,
        ) as loader:
            batches = list(loader)
            assert len(batches) == len(loader)
            out.append(batches)
    return out


def real_ids(batches):
    ids = [b["id"][b["mask"] > 0] if "mask" in b else b["id"] for b in batches]
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 200),
    batch_size=st.integers(1, 17),
    shard_count=st.integers(1, 5),
    last_batch=st.sampled_from(["partial", "drop", "pad"]),
    seed=st.integers(0, 1000),
)
def test_shards_disjoint_complete_and_balanced(n, batch_size, shard_count, last_batch, seed):
    shards = shard_batches(n, batch_size, shard_count, last_batch, seed)
    per_shard = [real_ids(b) for b in shards]
    everything = np.concatenate(per_shard)
    assert len(everything) == len(np.unique(everything)), "shards overlap"
    counts = [len(b) for b in shards]
    if last_batch == "partial":
        assert sorted(everything) == list(range(n))
        assert max(counts) - min(counts) <= 1
    elif last_batch == "drop":
        assert len(set(counts)) == 1
        assert len(everything) >= n - shard_count * batch_size - shard_count
        assert all(len(b["id"]) == batch_size for s in shards for b in s)
    else:
        assert sorted(everything) == list(range(n))
        assert len(set(counts)) == 1
        for s in shards:
            for b in s:
                assert len(b["id"]) == batch_size and b["x"].shape[0] == batch_size
                assert set(np.unique(b["mask"])) <= {0.0, 1.0}
                assert np.all(b["id"][b["mask"] == 0] == -1)
                assert np.all(b["id"][b["mask"] == 1] >= 0)
                real = b["mask"] == 1
                assert_paired({"x": b["x"][real], "y": b["y"][real], "id": b["id"][real]})


def test_pad_mask_on_a_small_known_case():
    (batches,) = shard_batches(10, 4, 1, "pad")
    assert [b["mask"].tolist() for b in batches][-1] == [1, 1, 0, 0]
    assert batches[-1]["id"][2:].tolist() == [-1, -1]


def test_shards_run_in_separate_loaders_with_workers_agree():
    a = shard_batches(103, 8, 3, "pad", workers=0)
    b = shard_batches(103, 8, 3, "pad", workers=2)
    for sa, sb in zip(a, b):
        for x, y in zip(sa, sb):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])
