"""The weighted / class-balanced sampler is deterministic per (seed, epoch) and balances."""

import numpy as np
import pytest
from helpers import paired_source

from steadyfeed import Loader, WeightedSampler

pytestmark = pytest.mark.timeout(60)


def test_deterministic_per_seed_and_epoch():
    s = WeightedSampler(np.arange(1, 101))
    assert np.array_equal(s.epoch_order(100, 0, 0), s.epoch_order(100, 0, 0))
    assert not np.array_equal(s.epoch_order(100, 0, 0), s.epoch_order(100, 0, 1))
    assert not np.array_equal(s.epoch_order(100, 0, 0), s.epoch_order(100, 1, 0))


def test_balanced_draws_classes_equally():
    labels = np.r_[np.zeros(950, int), np.ones(50, int)]
    order = WeightedSampler.balanced(labels, num_samples=20000).epoch_order(1000, 3, 0)
    share = labels[order].mean()
    assert 0.47 < share < 0.53


def test_without_replacement_is_a_subset_without_repeats():
    order = WeightedSampler(np.ones(50), num_samples=20, replacement=False).epoch_order(50, 0, 0)
    assert len(set(order.tolist())) == 20


def test_loader_with_weighted_sampler_gives_repeats_their_own_augmentation():
    def tag(sample, rng):
        return {**sample, "r": np.float64(rng.random())}

    sampler = WeightedSampler(np.r_[100.0, np.ones(9)], num_samples=200)
    with Loader(paired_source(10), 20, sampler=sampler, transform=tag, with_ids=True) as loader:
        assert len(loader) == 10
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    r = np.concatenate([b["r"] for b in batches])
    zero = r[ids == 0]
    assert len(zero) > 100 and len(np.unique(zero)) == len(zero)


def test_bad_weights_are_refused():
    with pytest.raises(ValueError):
        WeightedSampler([0, 0])
    with pytest.raises(ValueError):
        WeightedSampler([1, -1])
    with pytest.raises(ValueError, match="3 weights but the source has 5"):
        WeightedSampler([1, 1, 1]).epoch_order(5, 0, 0)


def test_draws_follow_the_weights_and_never_pick_a_zero_weight_id():
    """Chi-square of 100,000 draws against the weights (4 df, tolerance df + 6 sqrt(2 df))."""
    weights = np.array([0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 10.0, 0.0])
    draws = 100_000
    order = WeightedSampler(weights, num_samples=draws).order(len(weights), 5, 0)
    counts = np.bincount(order.take(np.arange(draws)), minlength=len(weights))
    assert counts[weights == 0].sum() == 0
    expected = draws * weights[weights > 0] / weights.sum()
    chi2 = ((counts[weights > 0] - expected) ** 2 / expected).sum()
    assert chi2 < 4 + 6 * np.sqrt(8)


def test_each_draw_is_computed_on_its_own_from_the_weights_alone():
    sampler = WeightedSampler(np.arange(1.0, 1001.0), num_samples=10**12)  # a trillion draws: never listed
    order = sampler.order(1000, 2, 7)
    positions = np.array([0, 5, 10**12 - 1, 123_456_789])
    np.testing.assert_array_equal(order.take(positions), [order.take([p])[0] for p in positions])
    assert len(order) == 10**12 and order.cdf is sampler._cdf  # the weights' cumulative sums, shared
    with Loader(paired_source(1000), 64, sampler=sampler) as loader:
        assert len(loader) == -(-(10**12) // 64)
