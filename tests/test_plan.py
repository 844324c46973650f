"""build_plan on its own: the plan of one epoch for one shard, for any order, size and policy."""

import math
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed.sampling.plan import LAST_BATCH_POLICIES, BatchSpec, build_plan


def plans(order, batch_size, shard_count, last_batch, with_draws=False):
    return [
        build_plan(
            order,
            batch_size=batch_size,
            shard_index=r,
            shard_count=shard_count,
            last_batch=last_batch,
            with_draws=with_draws,
        )
        for r in range(shard_count)
    ]


def real(plan):
    ids = [spec.ids[: spec.num_real] for spec in plan]
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


orders = st.integers(0, 120).flatmap(lambda n: st.permutations(list(range(n))).map(lambda p: np.array(p, np.int64)))


@settings(max_examples=200, deadline=None)
@given(
    order=orders,
    batch_size=st.integers(1, 13),
    shard_count=st.integers(1, 6),
    last_batch=st.sampled_from(LAST_BATCH_POLICIES),
)
def test_shards_split_the_order_round_robin_and_batch_it_in_order(order, batch_size, shard_count, last_batch):
    n = len(order)
    per_shard = plans(order, batch_size, shard_count, last_batch)
    kept = order[: (n // shard_count) * shard_count] if last_batch == "drop" else order
    for r, plan in enumerate(per_shard):
        mine = kept[r::shard_count]
        if last_batch == "drop":
            mine = mine[: (len(mine) // batch_size) * batch_size]
        np.testing.assert_array_equal(real(plan), mine)  # this shard's ids, in the global order
        assert [spec.index for spec in plan] == list(range(len(plan)))
        for spec in plan:
            assert 0 <= spec.num_real <= batch_size and len(spec.ids) >= 1
            assert spec.pad_to == (batch_size if last_batch == "pad" else None)
        assert all(spec.num_real == batch_size for spec in plan[:-1])  # only the last batch may be short
    counts = [len(plan) for plan in per_shard]
    if last_batch == "pad":
        assert len(set(counts)) == 1 and counts[0] == math.ceil(math.ceil(n / shard_count) / batch_size)
    elif last_batch == "drop":
        assert len(set(counts)) == 1 and counts[0] == (n // shard_count) // batch_size
    else:
        assert max(counts) - min(counts) <= 1
        np.testing.assert_array_equal(np.sort(np.concatenate([real(p) for p in per_shard])), np.arange(n))


@settings(max_examples=100, deadline=None)
@given(
    order=st.lists(st.integers(0, 9), max_size=60).map(lambda v: np.array(v, np.int64)),
    batch_size=st.integers(1, 7),
    shard_count=st.integers(1, 4),
)
def test_draws_are_order_positions_so_every_appearance_has_its_own(order, batch_size, shard_count):
    """With repeating ids, an id's draw is its position in the epoch's order: distinct per appearance."""
    for r, plan in enumerate(plans(order, batch_size, shard_count, "partial", with_draws=True)):
        draws = np.concatenate([s.draws for s in plan]) if len(plan) else np.zeros(0, np.int64)
        np.testing.assert_array_equal(draws, np.arange(r, len(order), shard_count))
        np.testing.assert_array_equal(real(plan), order[draws])
    assert all(
        spec.draws is None
        for spec in build_plan(
            order, batch_size=batch_size, shard_index=0, shard_count=1, last_batch="partial", with_draws=False
        )
    )


def test_a_shard_with_nothing_left_borrows_one_id_for_its_shape():
    plan = build_plan(
        np.arange(3, dtype=np.int64), batch_size=4, shard_index=3, shard_count=4, last_batch="pad", with_draws=False
    )
    assert len(plan) == 1 and plan[0].num_real == 0 and len(plan[0].ids) == 1 and plan[0].pad_to == 4


@settings(max_examples=60, deadline=None)
@given(
    order=orders,
    batch_size=st.integers(1, 13),
    shard_count=st.integers(1, 4),
    last_batch=st.sampled_from(LAST_BATCH_POLICIES),
    block=st.integers(1, 40),
    data=st.data(),
)
def test_batches_computed_in_blocks_are_the_same_in_any_order_of_access(
    order, batch_size, shard_count, last_batch, block, data
):
    """The plan computes positions a block at a time; any block size and any access order give the same batches."""
    import steadyfeed.sampling.plan as plan_module

    reference = plans(order, batch_size, shard_count, last_batch, with_draws=True)
    saved = plan_module.BLOCK_IDS
    plan_module.BLOCK_IDS = block
    try:
        for r, expected in enumerate(reference):
            plan = plans(order, batch_size, shard_count, last_batch, with_draws=True)[r]
            visits = data.draw(st.permutations(list(range(len(plan)))))
            for i in [*visits, *visits[::-1]]:
                got, want = plan[i], expected[i]
                np.testing.assert_array_equal(got.ids, want.ids)
                np.testing.assert_array_equal(got.draws, want.draws)
                assert (got.num_real, got.pad_to, got.index) == (want.num_real, want.pad_to, want.index)
    finally:
        plan_module.BLOCK_IDS = saved


def test_a_batch_spec_pickles_to_equal_writable_ids_and_draws():
    """Process workers get their specs by pickle (ids as bytes: ``BatchSpec.__reduce__``): the
    same ids and draws, int64, writable as the consumer's are (a source may sort what it gets)."""
    spec = BatchSpec(3, np.array([7, 2, 9], np.int64), np.array([0, 5, 1], np.int64), 4, 3)
    for copy in (pickle.loads(pickle.dumps(spec, protocol)) for protocol in (2, pickle.HIGHEST_PROTOCOL)):
        assert (copy.index, copy.pad_to, copy.num_real) == (3, 4, 3)
        np.testing.assert_array_equal(copy.ids, spec.ids)
        np.testing.assert_array_equal(copy.draws, spec.draws)
        assert copy.ids.dtype == np.int64 and copy.ids.flags.writeable and copy.draws.flags.writeable
        copy.ids.sort()
    assert pickle.loads(pickle.dumps(BatchSpec(0, np.arange(2), None, None, 2))).draws is None
