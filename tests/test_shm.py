"""execution/shm.py: process workers' batches lent to the consumer as views of their slots.

The unit tests drive both ends of one slot in this process (``WorkerSlots`` writes, as a
worker does; ``ConsumerSlots`` lends or copies, as the receiver does). The loader tests check
what a user sees: lent batches equal to ``workers=0``'s bit for bit, never written again while
any array of theirs is alive, and nothing left behind once they go.
"""

import gc
import os
import signal

import numpy as np
import pytest
from helpers import child_processes, epoch_digest, paired_source
from hypothesis import given
from hypothesis import strategies as st

from steadyfeed import Loader
from steadyfeed.execution import shm

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shm.ConsumerSlots.lends, reason="slots are lent where POSIX shared memory is"),
]


@pytest.fixture
def slot():
    """One worker slot holding a batch (x: 5 x 3 float32 counting up, id: 5 int64), its layout, and both ends."""
    name = shm.slot_name(shm.owner_token(), 0, 0)
    worker, consumer = shm.WorkerSlots(), shm.ConsumerSlots()
    allocate = worker.allocator(name)
    arrays = allocate({"x": ((5, 3), np.float32), "id": ((5,), np.int64)})
    arrays["x"][:] = np.arange(15, dtype=np.float32).reshape(5, 3)
    arrays["id"][:] = np.arange(5)
    del arrays
    yield name, allocate.layout, worker, consumer
    worker.close()
    consumer.discard([name])


def test_a_held_slot_is_lent_as_views_and_returned_when_its_last_array_goes(slot):
    name, layout, worker, consumer = slot
    consumer.hold(name)
    batch = consumer.receive(name, layout)
    assert consumer.lent == 1 and consumer.held([name]) == {name}
    assert all(type(a) is np.ndarray and a.flags.writeable and a.flags.c_contiguous for a in batch.values())
    assert not batch["x"].flags.owndata  # a view of the slot: no copy
    np.testing.assert_array_equal(batch["x"], np.arange(15, dtype=np.float32).reshape(5, 3))
    np.testing.assert_array_equal(batch["id"], np.arange(5))
    row = batch["x"][2]  # a view of a view keeps the slot held too
    del batch
    assert consumer.held([name]) == {name}
    assert row.tolist() == [6.0, 7.0, 8.0]
    del row
    assert consumer.held([name]) == set()


def test_an_unheld_slot_is_copied_out(slot):
    name, layout, worker, consumer = slot
    batch = consumer.receive(name, layout)
    assert consumer.lent == 0 and batch["x"].flags.owndata
    np.testing.assert_array_equal(batch["x"], np.arange(15, dtype=np.float32).reshape(5, 3))


def test_a_batch_that_did_not_come_through_its_slot_ends_the_hold(slot):
    name, layout, worker, consumer = slot
    consumer.hold(name)
    assert consumer.receive(name, None) is None
    assert consumer.held([name]) == set() and consumer.lent == 0


def test_a_lent_batch_stays_whole_after_its_slot_is_unlinked_and_unmaps_when_it_goes(slot):
    name, layout, worker, consumer = slot
    consumer.hold(name)
    batch = consumer.receive(name, layout)
    worker.close()
    consumer.discard([name])  # the worker is gone: its slot is unlinked at once
    assert name not in os.listdir("/dev/shm")
    fds = len(os.listdir("/proc/self/fd"))
    np.testing.assert_array_equal(batch["x"], np.arange(15, dtype=np.float32).reshape(5, 3))
    batch["x"][0, 0] = 42.0  # still mapped, still writable
    del batch
    assert len(os.listdir("/proc/self/fd")) == fds - 1  # the batch's own mapping, and its descriptor, went with it


def test_the_consumer_maps_a_slot_once_and_keeps_one_descriptor_for_it_until_discarded(slot):
    name, layout, worker, consumer = slot
    fds = len(os.listdir("/proc/self/fd"))
    copied = consumer.receive(name, layout, 1)
    assert len(os.listdir("/proc/self/fd")) == fds + 1  # mapped at its first batch
    consumer.hold(name)
    lent = [consumer.receive(name, layout, 1)]
    assert len(os.listdir("/proc/self/fd")) == fds + 1  # the same mapping: no fault-in per batch
    lent.clear()
    consumer.discard([name])
    assert len(os.listdir("/proc/self/fd")) == fds and copied["x"].sum() == 105.0


def test_a_slot_created_again_under_its_name_is_mapped_again(slot):
    """A slot that must grow is unlinked and created again, bigger, under the same name; one
    that found no room is created again later, maybe smaller. Either way the old mapping shows
    the old segment: the worker's count of creations tells the consumer to map the new one."""
    name, layout, worker, consumer = slot
    consumer.hold(name)
    old = consumer.receive(name, layout, worker.generations[name])
    allocate = worker.allocator(name)
    arrays = allocate({"x": ((50, 3), np.float32), "id": ((50,), np.int64)})  # too big: created again
    arrays["x"][:] = -1.0
    arrays["id"][:] = np.arange(50)
    del arrays
    assert worker.generations[name] == 2
    new = consumer.receive(name, allocate.layout, worker.generations[name])
    assert new["x"].shape == (50, 3) and (new["x"] == -1.0).all() and new["id"].tolist() == list(range(50))
    np.testing.assert_array_equal(old["x"], np.arange(15, dtype=np.float32).reshape(5, 3))  # still whole
    del old, new


DTYPES = ("u1", "i1", "<f4", "<i8", "<f8", "<c16", "?")


@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 9), max_size=3)), min_size=1, max_size=4))
def test_a_slot_layout_keeps_every_array_apart_aligned_and_bytes_off_vector_boundaries(arrays):
    """Within the segment, apart and each on its dtype's alignment; arrays of bytes start off
    16- and 32-byte boundaries (libjpeg-turbo writes aligned rows past the caches), the rest on 64."""
    layout, size = shm.layout_of({f"a{i}": (tuple(shape), dtype) for i, (dtype, shape) in enumerate(arrays)})
    spans = []
    for _key, dtype, shape, offset in layout:
        dtype = np.dtype(dtype)
        spans.append((offset, offset + int(np.prod(shape)) * dtype.itemsize))
        assert offset % dtype.alignment == 0
        assert offset % 16 != 0 if dtype.itemsize == 1 else offset % 64 == 0
    spans.sort()
    assert spans[-1][1] <= size and all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


def _in_a_slot(array) -> bool:
    """Whether ``array`` views a shared-memory slot (lent), not memory of its own (copied out
    of one: a batch cut from a task of several is a view of that copy)."""
    while isinstance(array, np.ndarray):
        if isinstance(array, shm._Lent):  # the slot's bytes as lent (shm.ConsumerSlots.receive)
            return True
        array = array.base
    return False


def _fresh_loader(**options):
    return Loader(paired_source(240), 8, shuffle=True, seed=5, with_ids=True, inline_when_faster=False, **options)


def test_kept_batches_are_never_written_again(no_leaks):
    """Every batch of two epochs kept at once: the first few lent, the others copied, and
    all of them still equal, bit for bit, to the batches the consumer makes alone."""
    with _fresh_loader(workers=0) as loader:
        expected = [list(loader.epoch(e)) for e in range(2)]
    with _fresh_loader(workers=2, mode="process", transport="shm") as loader:
        kept = [list(loader.epoch(e)) for e in range(2)]
        stats = loader.stats()
    assert [epoch_digest(b) for b in kept] == [epoch_digest(b) for b in expected]
    # a slot holds one task's batches: batches_per_task of them (what "auto" picked)
    lent_at_most = shm.LENT_SLOTS * 2 * stats["batches_per_task"]
    assert 0 < stats["lent_batches"] <= lent_at_most and stats["lending_stopped"] is None
    lent = [b for epoch in kept for b in epoch if _in_a_slot(b["x"])]
    assert len(lent) == stats["lent_batches"]
    del kept, lent


def test_batches_dropped_as_they_come_are_lent_again_and_again(no_leaks):
    with _fresh_loader(workers=0) as loader:
        expected = epoch_digest(loader.epoch(0))
    # prefetch=1: at most one batch planned ahead, so whatever the speeds a worker never has
    # LENT_SLOTS held when it is given a task, and every batch is lent
    with _fresh_loader(workers=2, mode="process", transport="shm", prefetch=1) as loader:
        got = epoch_digest(loader.epoch(0))
        lent = loader.stats()["lent_batches"]
    assert got == expected
    assert lent > shm.LENT_SLOTS * 2  # slots came back and were lent again (30 batches)


def test_a_lent_batch_outlives_a_killed_worker_and_the_loader(no_leaks):
    with _fresh_loader(workers=0) as loader:
        first = next(iter(loader.epoch(0)))
    # retries: a worker killed while it writes a batch out is a blameless death, which counts
    with _fresh_loader(workers=2, mode="process", transport="shm", retries=2) as loader:
        batches = iter(loader.epoch(0))
        batch = next(batches)
        assert not batch["x"].flags.owndata
        for worker in child_processes():
            os.kill(worker.pid, signal.SIGKILL)
        rest = list(batches)  # the killed workers' tasks run again in their replacements
    assert len(rest) == 29
    assert epoch_digest([batch]) == epoch_digest([first])  # whole, after its worker and the loader are gone
    del batch, rest, batches
    gc.collect()
