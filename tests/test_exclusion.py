"""Isolation (issue 17, item 4): excluded ids are part of the plan and of the state.

Exactly once over the remaining samples for any exclusion set, shard count, last_batch policy,
worker count and mode; exclude() mid-epoch takes effect from the next epoch; resume and
merge_states keep the exclusions; audit reports excluded ids as excluded, not missing.
"""

import json

import numpy as np
import pytest
from helpers import epoch_digest, noisy, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

import steadyfeed as sf
from steadyfeed import Loader, merge_states
from steadyfeed.diagnostics.isolation import read_exclusions
from steadyfeed.sampling.exclusion import Exclusions, excluding
from steadyfeed.sampling.permutation import Permutation
from steadyfeed.sampling.plan import LAST_BATCH_POLICIES
from steadyfeed.sampling.samplers import ArrayOrder, WeightedSampler
from steadyfeed.tools.audit import audit


def delivered(loaders, epoch):
    """Real-row ids of one epoch over all shards, in delivery order per shard."""
    out = []
    for loader in loaders:
        for batch in loader.epoch(epoch):
            real = batch["mask"] > 0 if "mask" in batch else np.ones(len(batch["id"]), bool)
            out.append(batch["id"][real])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def shard_loaders(n, batch_size, shard_count, last_batch, exclude, shuffle=True, **kw):
    return [
        Loader(
            paired_source(n),
            batch_size,
            shuffle=shuffle,
            seed=3,
            with_ids=True,
            exclude=exclude,
            last_batch=last_batch,
            shard_index=r,
            shard_count=shard_count,
            **kw,
        )
        for r in range(shard_count)
    ]


@pytest.mark.timeout(600)
@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 90),
    data=st.data(),
    batch_size=st.integers(1, 9),
    shard_count=st.integers(1, 4),
    last_batch=st.sampled_from(LAST_BATCH_POLICIES),
    shuffle=st.booleans(),
    workers=st.sampled_from([0, 2]),
)
def test_exactly_once_over_the_remaining_samples_for_any_exclusion_set(
    n, data, batch_size, shard_count, last_batch, shuffle, workers
):
    """(Process workers run the same plans: test_batches_with_exclusions_are_identical_...)"""
    excluded = data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else set()
    loaders = shard_loaders(n, batch_size, shard_count, last_batch, sorted(excluded), shuffle=shuffle, workers=workers)
    ids = delivered(loaders, epoch=1)
    rest = np.setdiff1d(np.arange(n), sorted(excluded))
    assert not np.isin(ids, sorted(excluded)).any()
    if last_batch == "drop":  # the documented rule on what remains: R * ((M // R) // B) * B distinct ids
        assert (
            len(set(ids.tolist())) == len(ids) == shard_count * ((len(rest) // shard_count) // batch_size) * batch_size
        )
    else:
        np.testing.assert_array_equal(np.sort(ids), rest)
    for loader in loaders:  # len(loader) is the batch count actually delivered
        assert len(loader) == sum(1 for _ in loader.epoch(0))
    if last_batch != "partial":
        assert len({len(loader) for loader in loaders}) == 1  # replicas still take the same number of steps
    for loader in loaders:
        loader.close()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 2**40), key=st.integers(0, 2**32), data=st.data())
def test_the_permutation_inverts_at_any_size(n, key, data):
    if n == 0:
        return
    values = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50)), np.int64)
    perm = Permutation(n, (key, 1))
    np.testing.assert_array_equal(perm.take(perm.positions_of(values)), values)


def test_a_huge_epoch_excludes_without_listing_it():
    """10^12 samples, a thousand excluded: the order is inverted at those ids only (O(excluded))."""
    order = sf.ShuffleSampler().order(10**12, 0, 0)
    ids = np.arange(0, 10**12, 10**9, dtype=np.int64)
    rest = excluding(order, ids)
    assert len(rest) == 10**12 - len(ids)
    positions = np.sort(order.positions_of(ids))
    around = np.unique(np.clip(np.concatenate([positions - 1, positions + 1]), 0, 10**12 - 1))
    around = around[~np.isin(around, positions)]
    mapped = rest.take(around - np.searchsorted(positions, around))  # what lies next to each excluded position
    np.testing.assert_array_equal(mapped, order.take(around))
    assert not np.isin(rest.take(np.arange(10**5)), ids).any()


def test_weighted_draws_never_return_an_excluded_id_and_keep_the_others_streams():
    weights = np.linspace(1, 2, 40)
    full = Loader(paired_source(40), 8, sampler=WeightedSampler(weights, 200), with_ids=True, transform=noisy)
    less = Loader(
        paired_source(40), 8, sampler=WeightedSampler(weights, 200), with_ids=True, transform=noisy, exclude=[0, 7, 39]
    )
    a = np.concatenate([b["id"] for b in full.epoch(0)])
    rows = {}
    for batch in full.epoch(0):
        for i, x in zip(batch["id"].tolist(), batch["x"]):
            rows.setdefault(i, []).append(x)
    got = {}
    for batch in less.epoch(0):
        for i, x in zip(batch["id"].tolist(), batch["x"]):
            got.setdefault(i, []).append(x)
    assert not {0, 7, 39} & set(got) and {0, 7, 39} & set(a.tolist())
    for i, xs in got.items():  # the same draws, the same augmentations: excluding changes no other stream
        np.testing.assert_array_equal(np.array(xs), np.array(rows[i]))
    assert len(less) == len(list(less.epoch(1)))


def test_an_array_order_is_filtered_by_scanning_too():
    order = ArrayOrder(np.array([4, 1, 4, 2, 0, 3]), may_repeat=True)
    rest = excluding(order, np.array([4]))
    np.testing.assert_array_equal(rest.take(np.arange(len(rest))), [1, 2, 0, 3])
    np.testing.assert_array_equal(rest.source_positions(np.arange(4)), [1, 3, 4, 5])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,mode", [(2, "thread"), (2, "process")])
def test_batches_with_exclusions_are_identical_for_any_workers_and_mode(workers, mode, no_leaks):
    kw = dict(shuffle=True, seed=5, transform=noisy, with_ids=True, exclude={3: "blur", 50: "dup", 199: "noise"})
    with (
        Loader(paired_source(200), 16, **kw) as inline,
        Loader(paired_source(200), 16, workers=workers, mode=mode, **kw) as pooled,
    ):
        for epoch in range(2):
            reference = list(inline.epoch(epoch))
            got = list(pooled.epoch(epoch))
            assert epoch_digest(got) == epoch_digest(reference)
            labels = paired_source(200)[0]["y"].dtype
            for batch in got:  # each row keeps its own label (x is augmented, y is label_of the stored x)
                np.testing.assert_array_equal(batch["y"], (4 * batch["id"] * 4 + 6) * 3 + 1)
                assert batch["y"].dtype == labels
            ids = np.concatenate([b["id"] for b in got])
            np.testing.assert_array_equal(np.sort(ids), np.setdiff1d(np.arange(200), [3, 50, 199]))


def test_exclude_mid_epoch_takes_effect_from_the_next_epoch():
    loader = Loader(paired_source(60), 8, shuffle=True, with_ids=True)
    assert loader.exclude([1, 2], "between epochs") == 0  # the cursor stands at epoch 0's start
    it = iter(loader)
    first = [next(it)["id"]]
    assert loader.exclude([10, 11, 12], "mid-epoch") == 1
    first += [b["id"] for b in it]
    ids = np.concatenate(first)
    np.testing.assert_array_equal(np.sort(ids), np.setdiff1d(np.arange(60), [1, 2]))  # epoch 0 kept its plan
    second = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(second), np.setdiff1d(np.arange(60), [1, 2, 10, 11, 12]))
    assert loader.excluded() == [
        {"id": 1, "reason": "between epochs", "from_epoch": 0},
        {"id": 2, "reason": "between epochs", "from_epoch": 0},
        {"id": 10, "reason": "mid-epoch", "from_epoch": 1},
        {"id": 11, "reason": "mid-epoch", "from_epoch": 1},
        {"id": 12, "reason": "mid-epoch", "from_epoch": 1},
    ]
    assert [e["id"] for e in loader.excluded(0)] == [1, 2]
    assert loader.exclude([1], "again") == 2 and loader.excluded()[0]["reason"] == "between epochs"  # first wins
    it = iter(loader)
    next(it)  # a cursor inside epoch 2, no iterator running: the next epoch, 3
    it.close()
    assert loader.exclude([20]) == 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", [0, 2, 7])
def test_resume_keeps_the_exclusions(k, no_leaks):
    def make(workers=0, mode="thread"):
        return Loader(
            paired_source(120),
            8,
            shuffle=True,
            seed=2,
            transform=noisy,
            with_ids=True,
            workers=workers,
            mode=mode,
            exclude=[5, 6],
        )

    with make() as loader:
        list(loader)  # epoch 0
        loader.exclude([30, 31], "flagged")  # from epoch 1
        reference = list(loader)  # epoch 1
        following = list(loader)  # epoch 2
    with make(2, "process") as loader:
        list(loader)
        loader.exclude([30, 31], "flagged")
        it = iter(loader)
        for _ in range(k):
            next(it)
        it.close()
        state = json.loads(json.dumps(loader.state_dict()))
    with make(2, "thread") as loader:  # built with exclude=[5, 6] only: the state adds 30 and 31
        loader.load_state_dict(state)
        assert len(loader) == len(reference) and [e["id"] for e in loader.excluded(1)] == [5, 6, 30, 31]
        rest = list(loader)
        assert epoch_digest(rest) == epoch_digest(reference[k:])
        assert epoch_digest(list(loader)) == epoch_digest(following)


def test_a_loaders_own_exclusions_missing_from_a_state_start_where_exclude_would_put_them():
    saved = Loader(paired_source(50), 8, with_ids=True)
    it = iter(saved)
    next(it)
    it.close()
    state = saved.state_dict()  # epoch 0, batch 1, nothing excluded
    loader = Loader(paired_source(50), 8, with_ids=True, exclude=[0, 49])
    loader.load_state_dict(state)
    assert [e["from_epoch"] for e in loader.excluded()] == [1, 1]  # epoch 0 is under way: it keeps its plan
    rest = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(rest, np.arange(8, 50))


def test_merged_states_keep_the_exclusions_and_refuse_shards_that_disagree():
    def shard(r, count, exclude=(4, 9)):
        return Loader(
            paired_source(100),
            4,
            shuffle=True,
            seed=1,
            with_ids=True,
            shard_index=r,
            shard_count=count,
            exclude=list(exclude),
        )

    old = [shard(r, 2) for r in range(2)]
    seen = []
    for loader, k in zip(old, (3, 5)):
        it = iter(loader)
        seen += [next(it)["id"] for _ in range(k)]
        it.close()
    merged = merge_states([o.state_dict() for o in old])
    new = [shard(r, 3, exclude=()) for r in range(3)]
    for loader in new:
        loader.load_state_dict(merged)
        seen += [b["id"] for b in loader]
    ids = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(ids), np.setdiff1d(np.arange(100), [4, 9]))
    other = shard(1, 2, exclude=(4,))
    with pytest.raises(ValueError, match="excluded different ids"):
        merge_states([old[0].state_dict(), other.state_dict()])


def test_out_of_range_ids_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"cannot exclude id\(s\) \[100\]"):
        Loader(paired_source(100), 8, exclude=[3, 100])
    loader = Loader(paired_source(10), 8)
    with pytest.raises(ValueError, match=r"\[-1\]"):
        loader.exclude([-1])
    assert loader.excluded() == []


def test_replace_carries_the_exclusions_unless_exclude_is_changed():
    loader = Loader(paired_source(30), 8, exclude=[1])
    loader.exclude([2], "later")
    assert [e["id"] for e in loader.replace(workers=2).excluded()] == [1, 2]
    assert [e["id"] for e in loader.replace(exclude=[7]).excluded()] == [7]
    assert loader.replace(exclude=None).excluded() == []


def test_exclusions_read_from_findings_an_audit_report_and_a_quarantine_file(tmp_path):
    findings = {
        "quality": {"checks": {"blur": {"threshold": 1.0, "flagged": [{"id": 3, "score": 0.1}]}}},
        "duplicates": [
            {"a": 5, "b": 8, "distance": 2},
            {"a": 9, "b": 1, "distance": 0, "split_a": "train", "split_b": "val"},
        ],
        "label_noise": {"suspects": [{"id": 11, "given": 1, "predicted": 2, "score": 0.9}]},
        "quarantine": [{"id": 12, "error": "ValueError: bad"}],
        "excluded": [{"id": 13, "reason": "by hand"}],
    }
    expected = {
        3: "quality:blur",
        8: "near-duplicate of sample 5",
        9: "near-duplicate of val sample 1",
        11: "label_noise",
        12: "quarantine: ValueError: bad",
        13: "by hand",
    }
    report = tmp_path / "audit.json"
    report.write_text(json.dumps({"format": "steadyfeed.audit/1", "checks": [], "findings": findings}))
    for spec in (findings, str(report)):
        record = read_exclusions(spec)
        assert dict(zip(record.ids.tolist(), record.reasons)) == expected
    lines = tmp_path / "bad.jsonl"
    lines.write_text("\n".join(json.dumps({"sample_id": i, "error_type": "OSError"}) for i in (4, 2)) + "\n")
    loader = Loader(paired_source(20), 4, exclude=lines, with_ids=True)
    assert loader.excluded() == [
        {"id": 2, "reason": "quarantine: OSError", "from_epoch": 0},
        {"id": 4, "reason": "quarantine: OSError", "from_epoch": 0},
    ]
    ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(ids, np.setdiff1d(np.arange(20), [2, 4]))
    plain = tmp_path / "ids.json"
    plain.write_text("[1, 2, 3]")
    assert read_exclusions(plain).ids.tolist() == [1, 2, 3]
    assert Exclusions.from_state(Loader(paired_source(20), 4, exclude=plain).state_dict()["excluded"]).ids.tolist() == [
        1,
        2,
        3,
    ]


class FailsOn:
    """A source whose sample ``bad`` cannot be read (module-level: process workers pickle it)."""

    def __init__(self, n, bad):
        self.inner, self.bad = paired_source(n), bad

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return self.inner[i]


@pytest.mark.timeout(300)
def test_audit_reports_excluded_ids_as_excluded_not_missing(no_leaks):
    loader = Loader(FailsOn(64, bad=17), 8, shuffle=True, exclude={17: "unreadable", 40: "blurry"})
    report = audit(loader, epochs=2, settings=((0, "thread"), (2, "thread"), (2, "process")))
    assert report.passed, report.table()
    once = [c for c in report.checks if c.name == "exactly_once"]
    assert len(once) == 6
    for c in once:
        assert c.details["excluded"] == {"count": 2, "ids": [17, 40]} and c.details["missing"]["count"] == 0
        assert "2 excluded" in c.summary
    assert "all excluded" in next(c for c in report.checks if c.name == "readable").summary
    assert report.as_dict()["findings"]["excluded"] == [
        {"id": 17, "reason": "unreadable", "from_epoch": 0},
        {"id": 40, "reason": "blurry", "from_epoch": 0},
    ]
    unexcluded = audit(loader.replace(exclude=[40]), epochs=1, settings=((0, "thread"),))
    assert {c.name for c in unexcluded.failed} == {"readable", "exactly_once"}  # 17 read, failed: not excluded


def test_audit_fails_when_an_excluded_id_is_delivered(monkeypatch):
    """A plan that ignored the exclusion (simulated) is caught: the id is named as excluded but delivered."""
    loader = Loader(paired_source(32), 8, exclude=[5])
    monkeypatch.setattr("steadyfeed.loader.excluding", lambda order, ids: order)
    report = audit(loader, epochs=1, settings=((0, "thread"),))
    bad = next(c for c in report.checks if c.name == "exactly_once")
    assert not bad.passed and "excluded but delivered 1 (5)" in bad.summary


def test_cli_audit_takes_exclude_as_a_file(tmp_path, capsys):
    from steadyfeed.tools.cli import main

    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    np.save(tmp_path / "x.npy", x)
    ids = tmp_path / "ids.json"
    ids.write_text("[0, 39]")
    code = main(
        [
            "audit",
            "--npy",
            str(tmp_path / "x.npy"),
            "--exclude",
            str(ids),
            "--batch-size",
            "8",
            "--settings",
            "0",
            "--epochs",
            "1",
            "--json",
            "--no-progress",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["passed"]
    once = next(c for c in report["checks"] if c["name"] == "exactly_once")
    assert once["details"]["excluded"]["ids"] == [0, 39] and once["details"]["delivered"] == 38
