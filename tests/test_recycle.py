"""execution/recycle.py: thread workers make batches in buffers reused once nothing uses them.

The unit tests drive ``RecycledBuffers`` directly: a buffer comes back only when the last
array carved from it (or any view of one) is gone, at most ``keep`` wait, and the arrays lie
as in a shared-memory slot. The loader tests check what a user sees: thread workers' batches
equal to ``workers=0``'s bit for bit, kept ones never written again, under any pattern of
keeping and dropping.
"""

import gc

import numpy as np
import pytest
from helpers import epoch_digest, paired_source
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import Loader
from steadyfeed.execution import recycle, shm
from steadyfeed.execution.batch import output_is_copied
from steadyfeed.execution.pool import SLOTS_PER_WORKER
from steadyfeed.execution.task import WorkContext

pytestmark = pytest.mark.timeout(120)

SPECS = {"x": ((5, 3), np.dtype(np.float32)), "b": ((5, 7), np.dtype(np.uint8)), "id": ((5,), np.dtype(np.int64))}


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_a_buffer_is_reused_only_once_every_array_and_view_of_it_is_gone():
    buffers = recycle.RecycledBuffers(keep=4)
    first = buffers(SPECS)
    where = _address(first["x"])
    kept = first["b"][1:3].T  # a view of a view of one array
    del first
    gc.collect()
    assert buffers.waiting() == 0  # the view still holds the buffer
    again = buffers(SPECS)
    assert _address(again["x"]) != where
    del kept
    assert buffers.waiting() == 1
    reused = buffers(SPECS)
    assert _address(reused["x"]) == where and buffers.waiting() == 0
    del again, reused


def test_arrays_lie_as_in_a_shared_memory_slot():
    """Apart, of the shapes and dtypes asked, at the offsets of ``shm.layout_of`` from a 64-byte
    boundary: bytes 8 past one (off libjpeg-turbo's non-temporal stores), the rest on one."""
    arrays = recycle.RecycledBuffers(keep=1)(SPECS)
    layout, _ = shm.layout_of(SPECS)
    start = _address(arrays["x"]) - layout[0][3]
    assert start % recycle.ALIGN == 0
    for key, dtype, shape, offset in layout:
        assert arrays[key].shape == shape and arrays[key].dtype == np.dtype(dtype)
        assert type(arrays[key]) is np.ndarray and arrays[key].flags.writeable and arrays[key].flags.c_contiguous
        assert _address(arrays[key]) == start + offset
    assert _address(arrays["b"]) % 64 == 8


def test_at_most_keep_buffers_wait_and_a_closed_pool_keeps_none():
    buffers = recycle.RecycledBuffers(keep=2)
    batches = [buffers(SPECS) for _ in range(5)]
    del batches
    assert buffers.waiting() == 2
    held = buffers(SPECS)
    buffers.close()
    assert buffers.waiting() == 0
    del held
    assert buffers.waiting() == 0  # given back after close: freed, not kept


def test_a_buffer_too_small_for_a_grown_task_is_dropped_not_kept():
    buffers = recycle.RecycledBuffers(keep=4)
    small = buffers(SPECS)
    del small
    assert buffers.waiting() == 1
    big = buffers({"x": ((500, 3), np.dtype(np.float32))})
    assert buffers.waiting() == 0 and big["x"].shape == (500, 3)
    del big
    assert buffers.waiting() == 1
    smaller = buffers(SPECS)  # a big buffer serves a smaller task (the last one of an epoch)
    assert buffers.waiting() == 0 and smaller["x"].shape == (5, 3)


class _NoAllocate:
    """A source whose ``read_batch`` makes arrays of its own (no ``allocate``)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": np.zeros(2)}

    def read_batch(self, ids):
        return {"x": np.zeros((len(ids), 2))}


def test_buffers_only_where_the_batch_is_written_into_them_anyway():
    """A ``read_batch`` called without ``allocate`` hands over arrays the batch keeps: buffers
    would add a copy."""

    def context(source, transform=None, collate="stack"):
        return WorkContext(source, transform, seed=0, retries=0, stop_on_failure=True, collate=collate)

    assert output_is_copied(context(paired_source(4)))  # ArraySource reads into what it is given
    assert not output_is_copied(context(paired_source(4), collate="pad"))  # not under "pad"
    assert not output_is_copied(context(_NoAllocate()))
    assert output_is_copied(context(_NoAllocate(), transform=lambda s, rng: s))  # samples stacked anew


def _loader(**options):
    return Loader(paired_source(240), 8, shuffle=True, seed=5, with_ids=True, **options)


def _memory_of(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory ``array`` lies in (a recycled buffer's bytes)."""
    while array.base is not None:
        array = array.base
    return array


def test_thread_batches_are_made_in_reused_buffers_and_equal_workers_0s():
    with _loader(workers=0) as loader:
        expected = [epoch_digest(loader.epoch(e)) for e in range(3)]
    with _loader(workers=2, mode="thread", inline_when_faster=False, batches_per_task=1) as loader:
        got = [epoch_digest(loader.epoch(e)) for e in range(3)]
        buffers = {}  # held: two buffers alive at once are two objects
        for e in range(3, 5):
            for batch in loader.epoch(e):
                buffer = _memory_of(batch["x"])
                buffers[id(buffer)] = buffer
    assert got == expected
    # 60 tasks of one batch, made in the buffers of two workers' tasks in flight and batches ready
    assert len(buffers) <= 2 * SLOTS_PER_WORKER


@settings(max_examples=15, deadline=None)
@given(keep=st.lists(st.booleans(), min_size=30, max_size=30), workers=st.integers(1, 3))
def test_kept_thread_batches_are_never_written_again(keep, workers):
    """Whichever batches the consumer keeps while the workers go on, each stays equal to what
    it was when delivered, and to ``workers=0``'s, through the next epoch too."""
    with _loader(workers=0) as loader:
        expected = [list(loader.epoch(e)) for e in range(2)]
    with _loader(workers=workers, mode="thread", inline_when_faster=False, prefetch=2) as loader:
        kept = []
        for e in range(2):
            for k, batch in enumerate(loader.epoch(e)):
                assert epoch_digest([batch]) == epoch_digest([expected[e][k]])
                if keep[k]:
                    kept.append((batch, expected[e][k]))
        for batch, want in kept:
            assert epoch_digest([batch]) == epoch_digest([want])
