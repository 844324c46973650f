"""Elastic resume: a mid-epoch checkpoint of N shards, merged, resumes on M shards; the rest
of the epoch is delivered exactly once across them and later epochs are planned for M."""

import json
from collections import Counter

import numpy as np
import pytest
from helpers import epoch_digest, noisy, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import Loader, WeightedSampler, merge_states

pytestmark = pytest.mark.timeout(180)


def real_ids(batches):
    ids = [b["id"][b["mask"] > 0] if "mask" in b else b["id"] for b in batches]
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


def make(n, batch_size, shard, count, policy, seed=0, **kw):
    return Loader(
        paired_source(n),
        batch_size,
        shuffle=kw.pop("shuffle", "sampler" not in kw),
        seed=seed,
        shard_index=shard,
        shard_count=count,
        last_batch=policy,
        with_ids=True,
        **kw,
    )


def take(loader, k):
    """The first ``k`` batches from the loader's cursor, then a checkpoint (the job is "killed")."""
    it = iter(loader)
    batches = [next(it) for _ in range(k)]
    it.close()
    return batches, json.loads(json.dumps(loader.state_dict()))


def run_shards(n, batch_size, count, policy, progress, seed=0, state=None, **kw):
    """Shards 0..count-1, each (from ``state``, if any) taking ``progress[r]`` of what is left of its epoch."""
    delivered, states = [], []
    epoch = 0 if state is None else state["epoch"]
    for r in range(count):
        with make(n, batch_size, r, count, policy, seed, **kw) as loader:
            if state is not None:
                loader.load_state_dict(state)
            left = loader.batches_in(epoch) - loader.cursor[1] if loader.cursor[0] == epoch else 0
            batches, saved = take(loader, round(progress[r % len(progress)] * left))
            delivered.append(real_ids(batches))
            states.append(saved)
    return delivered, states


def resume_all(n, batch_size, count, policy, merged, seed=0, **kw):
    """Every new shard runs the rest of the merged epoch; then one more epoch."""
    rest, batch_counts, next_epochs = [], [], []
    for r in range(count):
        with make(n, batch_size, r, count, policy, seed, **kw) as loader:
            loader.load_state_dict(merged)
            # a shard with nothing left of the epoch starts at the next one (as after any finished epoch)
            batches = list(loader) if loader.cursor[0] == merged["epoch"] else []
            assert len(batches) == loader.batches_in(merged["epoch"])
            batch_counts.append(len(batches))
            rest.append(real_ids(batches))
            next_epochs.append(real_ids(list(loader)))
    return rest, batch_counts, next_epochs


def expected_drop(remaining, count, batch_size):
    return count * (((remaining // count) // batch_size) * batch_size)


@settings(max_examples=70, deadline=None)
@given(
    n=st.integers(0, 150),
    batch_size=st.integers(1, 9),
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    policy=st.sampled_from(["partial", "drop", "pad"]),
    seed=st.integers(0, 100),
    progress=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]), min_size=1, max_size=4),
)
def test_n_shards_resume_on_m_shards_delivering_the_rest_exactly_once(n, batch_size, old, new, policy, seed, progress):
    before, states = run_shards(n, batch_size, old, policy, progress, seed)
    before = np.concatenate(before)
    merged = json.loads(json.dumps(merge_states(states)))
    rest, counts, next_epochs = resume_all(n, batch_size, new, policy, merged, seed)
    if merged["epoch"] == 1:  # every old shard had finished epoch 0: the merge starts epoch 1
        assert merged["remainder"] is None
        next_epochs = rest
    after = np.concatenate(rest) if merged["epoch"] == 0 else np.zeros(0, np.int64)
    assert len(np.unique(after)) == len(after), "a sample delivered twice after the resume"
    assert not set(before.tolist()) & set(after.tolist()), "a sample delivered before was delivered again"
    if policy == "drop" and merged["epoch"] == 1:
        assert len(before) == expected_drop(n, old, batch_size)
    elif policy == "drop":
        assert len(after) == expected_drop(n - len(before), new, batch_size)
    else:
        assert sorted([*before.tolist(), *after.tolist()]) == list(range(n)), "a sample is missing"
    if policy != "partial":
        assert len(set(counts)) == 1, "the new shards have different batch counts"
    for r, ids in enumerate(next_epochs):  # later epochs: M shards, planned as usual
        with make(n, batch_size, r, new, policy, seed) as fresh:
            epoch = 1
            np.testing.assert_array_equal(ids, real_ids(list(fresh.epoch(epoch))))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 120),
    batch_size=st.integers(1, 6),
    counts=st.tuples(*[st.integers(1, 4)] * 3),
    policy=st.sampled_from(["partial", "pad"]),
)
def test_resumes_nest_n_to_m_to_p_shards(n, batch_size, counts, policy):
    first, middle, last = counts
    seen, states = run_shards(n, batch_size, first, policy, [0.3, 0.6])
    merged = merge_states(states)
    seen2, states2 = run_shards(n, batch_size, middle, policy, [0.5, 0.2, 0.7], state=merged)
    rest, _, _ = resume_all(n, batch_size, last, policy, merge_states(states2))
    everything = np.concatenate([*seen, *seen2, *rest]).tolist()
    assert sorted(everything) == list(range(n))


def test_a_weighted_epoch_resumes_with_the_same_draws_and_streams():
    """Repeating ids: the merged remainder serves each remaining draw once, with its own stream."""
    weights = np.r_[50.0, np.ones(29)]
    kw = dict(sampler=WeightedSampler(weights, num_samples=90), transform=noisy)
    with make(30, 4, 0, 1, "partial", **kw) as whole:
        reference = list(whole.epoch(0))
    by_draw = Counter((int(i), float(x)) for b in reference for i, x in zip(b["id"], b["x"][:, 1]))
    before, states = run_shards(30, 4, 3, "partial", [0.5, 0.25, 0.75], **kw)
    rest, _, _ = [], None, None
    for r in range(2):
        with make(30, 4, r, 2, "partial", **kw) as loader:
            loader.load_state_dict(merge_states(states))
            rest += list(loader)
    got = Counter((int(i), float(x)) for b in rest for i, x in zip(b["id"], b["x"][:, 1]))
    delivered_before = Counter(np.concatenate(before).tolist())
    assert sum(got.values()) + sum(delivered_before.values()) == 90
    assert not got - by_draw  # every draw after the resume is one of the epoch's draws, augmented as there


def test_resumed_remainder_is_bit_identical_across_workers_and_modes(no_leaks):
    _, states = run_shards(97, 8, 3, "pad", [0.4, 0.5, 0.3], transform=noisy)
    merged = merge_states(states)
    digests = set()
    for workers, mode in [(0, "thread"), (2, "thread"), (2, "process")]:
        with make(97, 8, 1, 2, "pad", transform=noisy, workers=workers, mode=mode) as loader:
            loader.load_state_dict(merged)
            digests.add(epoch_digest(loader))
    assert len(digests) == 1


def test_a_state_of_one_shard_count_is_refused_elsewhere_naming_merge_states():
    _, states = run_shards(50, 4, 2, "partial", [0.5])
    with make(50, 4, 0, 3, "partial") as loader:
        with pytest.raises(ValueError, match="shard 0 of 2, this loader is shard 0 of 3.*merge_states"):
            loader.load_state_dict(states[0])
    with make(50, 4, 1, 2, "partial") as loader:
        with pytest.raises(ValueError, match="shard 0 of 2, this loader is shard 1 of 2$"):
            loader.load_state_dict(states[0])


def test_merge_refuses_incomplete_or_mismatched_sets():
    _, states = run_shards(50, 4, 3, "partial", [0.5])
    with pytest.raises(ValueError, match="one state per shard 0..2"):
        merge_states(states[:2])
    with pytest.raises(ValueError, match="one state per shard"):
        merge_states([states[0], states[0], states[2]])
    _, other = run_shards(50, 4, 3, "partial", [0.5], seed=9)
    with pytest.raises(ValueError, match="fingerprints differ"):
        merge_states([states[0], other[1], other[2]])
    far = {**states[1], "epoch": 2, "next_batch": 1}
    with pytest.raises(ValueError, match="more than one epoch apart"):
        merge_states([states[0], far, states[2]])
    with pytest.raises(ValueError, match="itself a merge"):
        merge_states([merge_states(states)])


def test_an_older_state_format_is_refused_saying_why():
    with make(50, 4, 0, 1, "partial") as loader:
        old = {**loader.state_dict(), "format": "steadyfeed.loader/1"}
        with pytest.raises(ValueError, match=r"older steadyfeed \(steadyfeed.loader/1.*restart the epoch"):
            loader.load_state_dict(old)
        with pytest.raises(ValueError, match="older steadyfeed"):
            merge_states([old])


def test_a_merged_state_that_nobody_advanced_is_a_plain_epoch_start():
    _, states = run_shards(40, 4, 2, "partial", [0.0])
    merged = merge_states(states)
    assert (merged["epoch"], merged["next_batch"], merged["remainder"]) == (0, 0, None)
    _, done = run_shards(40, 4, 2, "partial", [1.0])
    assert (merge_states(done)["epoch"], merge_states(done)["remainder"]) == (1, None)
