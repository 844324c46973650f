"""Mixture: deterministic (component, item) per sample, shares in every window, components
cycling in fresh orders, resumable, named in failures and stats, in every mode and in audit."""

import json

import numpy as np
import pytest
from helpers import epoch_digest, noisy
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import ArraySource, Loader, Mixture
from steadyfeed.tools.audit import audit

pytestmark = pytest.mark.timeout(180)


def component(tag: int, n: int) -> ArraySource:
    """Sample k of component ``tag``: x = (tag, k), y = 10 * tag + k."""
    return ArraySource(
        x=np.stack([np.full(n, tag), np.arange(n)], axis=1).astype(np.float64),
        y=(10 * tag + np.arange(n)).astype(np.float64),
    )


def worst_share_error(mix: Mixture, start: int, stop: int, window: int) -> float:
    """The largest |share - weight| of any component over every window of ``window`` consecutive ids."""
    comps = mix.components_of(np.arange(start, stop))
    weights = np.asarray(mix.weights) / sum(mix.weights)
    worst = 0.0
    for c, weight in enumerate(weights):
        running = np.r_[0, np.cumsum(comps == c)]
        counts = running[window:] - running[:-window]  # every window's count of component c
        worst = max(worst, float(np.abs(counts / window - weight).max()))
    return worst


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.7, 0.2, 0.05, 0.05], [1, 2, 3, 4, 5, 6, 7], [0.999, 0.001]])
def test_every_window_of_10000_holds_each_share_within_one_point(weights):
    mix = Mixture([component(c, 1000 + 37 * c) for c in range(len(weights))], weights, length=10**13)
    assert worst_share_error(mix, 0, 60_000, 10_000) < 0.01
    assert worst_share_error(mix, 10**12, 10**12 + 30_000, 10_000) < 0.01  # deep in the id space too


def test_a_biased_interleaving_would_fail_the_window_check():
    """The check can fail: a mixture whose ids are grouped by component is far off in most windows."""

    class Grouped(Mixture):
        def components_of(self, ids):
            return (np.asarray(ids) >= 30_000).astype(np.int64)

    mix = Grouped([component(0, 10), component(1, 10)], [0.5, 0.5], length=60_000)
    assert worst_share_error(mix, 0, 60_000, 10_000) > 0.4


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4), seed=st.integers(0, 1000), data=st.data())
def test_within_a_component_no_item_repeats_before_all_have_appeared(sizes, seed, data):
    weights = data.draw(st.lists(st.floats(0.05, 1.0), min_size=len(sizes), max_size=len(sizes)))
    mix = Mixture([component(c, n) for c, n in enumerate(sizes)], weights, length=8 * sum(sizes), seed=seed)
    per_component = {c: [] for c in range(len(sizes))}
    for i in range(len(mix)):
        c, item = mix.resolve(i)
        per_component[c].append(item)
    for c, items in per_component.items():
        n = sizes[c]
        passes = [items[k : k + n] for k in range(0, len(items) - n + 1, n)]
        for one_pass in passes:
            assert sorted(one_pass) == list(range(n))
        if n >= 5 and len(passes) >= 2:
            assert passes[0] != passes[1], "each pass should have its own order"


def test_samples_map_deterministically_and_read_as_their_component_item():
    a = Mixture({"a": component(0, 50), "b": component(1, 20)}, [0.6, 0.4], seed=3)
    b = Mixture({"a": component(0, 50), "b": component(1, 20)}, [0.6, 0.4], seed=3)
    assert [a.resolve(i) for i in range(len(a))] == [b.resolve(i) for i in range(len(b))]
    assert len(a) == 70
    for i in (0, 5, 69):
        c, item = a.resolve(i)
        assert a[i]["x"].tolist() == [c, item]
    many = a.read_many([3, 1, 4, 1, 5])
    assert [s["x"].tolist() for s in many] == [a[i]["x"].tolist() for i in [3, 1, 4, 1, 5]]
    assert a.locate(0).startswith("component 'a' item") or a.locate(0).startswith("component 'b' item")
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != Mixture({"a": component(0, 50), "b": component(1, 20)}, [0.5, 0.5], seed=3).fingerprint()
    with pytest.raises(IndexError):
        a.resolve(70)
    with pytest.raises(ValueError, match="empty"):
        Mixture([component(0, 5), ArraySource(x=np.zeros((0, 2)))], [1, 1])
    with pytest.raises(ValueError, match="2 sources but 3 weights"):
        Mixture([component(0, 5), component(1, 5)], [1, 1, 1])


def test_a_zero_weight_component_never_appears():
    mix = Mixture([component(0, 5), component(1, 5), component(2, 5)], [1, 0, 1], length=1000)
    assert 1 not in {mix.resolve(i)[0] for i in range(1000)}


def mixture():
    return Mixture(
        {"big": component(0, 97), "small": component(1, 13), "mid": component(2, 40)},
        [0.5, 0.2, 0.3],
        length=600,
        seed=1,
    )


def test_identical_in_every_mode_and_resumable(no_leaks):
    digests = set()
    for workers, mode in [(0, "thread"), (2, "thread"), (2, "process")]:
        with Loader(mixture(), 16, transform=noisy, workers=workers, mode=mode, with_ids=True) as loader:
            digests.add(epoch_digest(loader))
    assert len(digests) == 1
    with Loader(mixture(), 16, transform=noisy, with_ids=True) as loader:
        reference = list(loader.epoch(0))
    with Loader(mixture(), 16, transform=noisy, with_ids=True) as loader:
        it = iter(loader)
        for _ in range(7):
            next(it)
        it.close()
        state = json.loads(json.dumps(loader.state_dict()))
    with Loader(mixture(), 16, transform=noisy, with_ids=True, workers=2) as loader:
        loader.load_state_dict(state)
        assert epoch_digest(loader) == epoch_digest(reference[7:])


class Broken:
    """A component whose item 3 cannot be read."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 3:
            raise OSError("disk says no")
        return {"x": np.array([9.0, i]), "y": np.float64(90 + i)}

    def locate(self, i):
        return f"broken.bin row {i}"


def test_failures_the_quarantine_and_stats_name_the_component():
    mix = Mixture({"good": component(0, 30), "flaky": Broken()}, [0.5, 0.5], length=40)
    with Loader(mix, 8, on_error="skip", max_error_fraction=0.5) as loader:
        delivered = sum(len(b["y"]) for b in loader)
        entry = loader.quarantine_report()[0]
        stats = loader.stats()["components"]
    assert entry["location"] == "component 'flaky' item 3: broken.bin row 3"
    skipped = len(loader.quarantine_report())
    assert stats["flaky"]["skipped"] == skipped >= 1 and stats["good"]["skipped"] == 0
    assert stats["good"]["samples"] + stats["flaky"]["samples"] == delivered == 40 - skipped
    assert stats["good"]["samples"] == 20
    with Loader(mix, 8) as loader:
        with pytest.raises(OSError, match="component 'flaky' item 3: broken.bin row 3"):
            list(loader)


def test_audit_passes_a_mixture():
    with Loader(mixture(), 16, shuffle=True) as loader:
        report = audit(loader, epochs=2, settings=[(0, "thread"), (2, "thread")])
    assert report.passed, report.table()
