"""The keyed Feistel permutation: a bijection for every n and key, random access, well shuffled.

The quality checks are statistical but deterministic (fixed keys): each statistic's
tolerance is derived from its sample size (chi-square: df + 6 sqrt(2 df); correlation:
6 / sqrt(n)), so a correct permutation passes by a wide margin and the result never
changes from run to run.
"""

import hashlib
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import Loader, ShuffleSampler
from steadyfeed.sampling.permutation import Permutation
from steadyfeed.sampling.samplers import permutation

pytestmark = pytest.mark.timeout(120)


def chi_square_limit(df: int) -> float:
    return df + 6 * np.sqrt(2 * df)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 3000), key=st.lists(st.integers(0, 2**40), min_size=1, max_size=3))
def test_a_bijection_of_range_n_for_every_key(n, key):
    values = Permutation(n, key).take(np.arange(n))
    np.testing.assert_array_equal(np.sort(values), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(10**9, 2**62),
    seed=st.integers(0, 2**31),
    positions=st.lists(st.integers(0, 10**9 - 1), min_size=1, max_size=200, unique=True),
)
def test_distinct_positions_give_distinct_values_in_range_at_any_size(n, seed, positions):
    perm = Permutation(n, (seed, 1))
    values = perm.take(np.array(positions))
    assert len(set(values.tolist())) == len(positions)
    assert values.min() >= 0 and values.max() < n
    np.testing.assert_array_equal(values, [perm.take(np.array([p]))[0] for p in positions])  # any batching


def test_a_key_gives_the_order_it_always_gave():
    """Pinned (values from the first release of this module): a seed's order is part of what a
    run is, so a resumed or reproduced run on a newer steadyfeed sees the same batches, and no
    speed-up of the rounds may change one value (10 rounds above 2**20 cells, 16 below)."""
    assert Permutation(10, (0,)).take(np.arange(8)).tolist() == [3, 8, 9, 4, 6, 1, 0, 7]
    assert Permutation(20000, (0, 1, 3)).take(np.arange(8)).tolist() == [
        4828,
        14970,
        16457,
        9149,
        7468,
        3726,
        2193,
        19764,
    ]
    assert Permutation(2**62, (7, 2)).take(np.arange(3)).tolist() == [
        1973688458796050316,
        1198003609678372255,
        2141887824730520002,
    ]
    for n, key, digest in [
        (20000, (0, 1, 3), "43b559123acfed51ce529116e07bf1d6715f084a9d12a9e9f1f7d2fa9358d3de"),
        (3_000_000, (5, 0, 2), "1749a5a8f3f75094f42dbd5d205475967de7a3416cd98a92fb1ca23b396bc7fd"),
    ]:
        values = Permutation(n, key).take(np.arange(n))
        assert hashlib.sha256(values.tobytes()).hexdigest() == digest
        np.testing.assert_array_equal(Permutation(n, key).positions_of(values), np.arange(n))


def test_the_same_key_gives_the_same_order_and_others_differ():
    a = permutation(1000, 5, 0).take(np.arange(1000))
    np.testing.assert_array_equal(a, permutation(1000, 5, 0).take(np.arange(1000)))
    assert not np.array_equal(a, permutation(1000, 5, 1).take(np.arange(1000)))
    assert not np.array_equal(a, permutation(1000, 6, 0).take(np.arange(1000)))
    assert not np.array_equal(
        permutation(1000, 6, 0).take(np.arange(1000)),  # not seed + epoch
        permutation(1000, 5, 1).take(np.arange(1000)),
    )
    with pytest.raises(IndexError):
        permutation(10, 0, 0).take(np.array([10]))


@pytest.mark.parametrize("n", [3, 5, 8, 50])
def test_every_item_lands_at_every_position_equally_often(n):
    """Over many epochs, the table (item, position) is uniform: a chi-square test with (n-1)^2 df."""
    epochs = 200 * n
    table = np.zeros((n, n), np.int64)
    for epoch in range(epochs):
        table[np.arange(n), permutation(n, 7, epoch).take(np.arange(n))] += 1
    expected = epochs / n
    chi2 = ((table - expected) ** 2 / expected).sum()
    assert chi2 < chi_square_limit((n - 1) ** 2), chi2


def test_a_run_of_consecutive_ids_spreads_over_the_whole_epoch():
    """Ids 0..9999 of a 10^6 permutation fall evenly into 100 stretches of positions (chi-square, 99 df)."""
    n, run, bins = 10**6, 10_000, 100
    values = permutation(n, 3, 0).take(np.arange(run))
    counts = np.bincount(values * bins // n, minlength=bins)
    expected = run / bins
    assert ((counts - expected) ** 2 / expected).sum() < chi_square_limit(bins - 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_correlation_between_neighbours_nor_with_the_position(seed):
    n = 200_000
    v = permutation(n, seed, 4).take(np.arange(n)).astype(np.float64)
    limit = 6 / np.sqrt(n)
    assert abs(np.corrcoef(v[:-1], v[1:])[0, 1]) < limit  # neighbouring ids of the order
    assert abs(np.corrcoef(np.arange(n), v)[0, 1]) < limit  # the order and the identity
    nxt = permutation(n, seed, 5).take(np.arange(n)).astype(np.float64)
    assert abs(np.corrcoef(v, nxt)[0, 1]) < limit  # one epoch and the next
    gaps = np.abs(np.diff(v))  # neighbours are as far apart as random pairs: mean |a-b| = n/3
    assert abs(gaps.mean() / (n / 3) - 1) < 6 * np.sqrt(0.5) / np.sqrt(n)


class Huge:
    """10^12 samples, each its own id: only the plan's arithmetic can serve it."""

    def __len__(self):
        return 10**12

    def __getitem__(self, i):
        return {"x": np.int64(i)}


def test_a_shuffled_plan_over_10_to_the_12_samples_is_a_few_integers():
    with Loader(
        Huge(), 64, shuffle=True, seed=1, shard_index=3, shard_count=7, last_batch="drop", with_ids=True
    ) as loader:
        plan = loader._plan(0)
        assert len(loader) == (10**12 // 7) // 64
        assert len(pickle.dumps(plan)) < 2000  # no array of the epoch's length anywhere in it
        last = loader.peek(len(loader) - 1)
        assert len(np.unique(last["id"])) == 64 and last["id"].max() < 10**12
        state = loader.state_dict()
        assert state["order_length"] == 10**12
        loader.seek(0, len(loader) - 1)
        assert [b["x"].tolist() for b in loader] == [last["x"].tolist()]


def test_epoch_order_is_the_whole_lazy_order():
    sampler = ShuffleSampler()
    order = sampler.order(500, 2, 3)
    np.testing.assert_array_equal(sampler.epoch_order(500, 2, 3), order.take(np.arange(500)))
