"""execution/batch.py: a source's ``read_batch(ids, allocate)`` reads straight into the batch.

A process worker's batch goes into a shared-memory slot. A source whose ``read_batch`` takes
an ``allocate`` is given one that places its columns there (with ``id`` beside them), so no
copy follows; a source without it, or one asking for columns the batch cannot hold as they
are, gets fresh arrays that are copied as before. The batch is the same either way.
"""

import numpy as np
import pytest
from helpers import Recording, label_of
from PIL import Image

from steadyfeed.execution.batch import numpy_allocator, run_batch
from steadyfeed.execution.task import BatchTask, StatusSlot, WorkContext
from steadyfeed.sampling.plan import BatchSpec
from steadyfeed.sources.images import ImageFolder

pytestmark = pytest.mark.timeout(60)


class Columns:
    """Eight samples (x: 3 float64 from 3i, y: label_of(x)) read as columns; ``ask`` changes what
    ``read_batch`` asks its allocator for (another key, another byte order)."""

    def __init__(self, ask=lambda specs: specs):
        self.x = np.arange(24, dtype=np.float64).reshape(8, 3)
        self.ask, self.given = ask, []

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": self.x[i], "y": label_of(self.x[i : i + 1])[0]}

    def read_batch(self, ids, allocate=None):
        self.given.append(allocate)
        x, y = self.x[ids], label_of(self.x[ids])
        if allocate is None:
            return {"x": x, "y": y}
        out = allocate(self.ask({"x": (x.shape, x.dtype), "y": (y.shape, y.dtype)}))
        for key, column in (("x", x), ("y", y)):
            out[key][...] = column
        return {key: out[key] for key in ("x", "y")}


def spy(source) -> list:
    """What ``source.read_batch`` returns, call by call (read into the batch: the slot's arrays)."""
    read, returned = source.read_batch, []
    source.read_batch = lambda ids, allocate=None: returned.append(read(ids, allocate=allocate)) or returned[-1]
    return returned


def run(source, allocate=numpy_allocator, ids=(5, 1, 6)):
    ids = np.array(ids, np.int64)
    task = BatchTask(0, 0, BatchSpec(0, ids, None, None, len(ids)))
    result = run_batch(task, WorkContext(source, None, 0, 0, False), StatusSlot([-1, -1, 0.0]), allocate=allocate)
    assert result.failures == () and result.arrays is not None
    return result.arrays


def expected(ids=(5, 1, 6)):
    x = np.arange(24, dtype=np.float64).reshape(8, 3)[list(ids)]
    return {"x": x, "y": label_of(x), "id": np.array(ids, np.int64)}


def assert_batch(batch, ids=(5, 1, 6)):
    assert sorted(batch) == ["id", "x", "y"]
    for key, want in expected(ids).items():
        np.testing.assert_array_equal(batch[key], want)
        assert batch[key].dtype == want.dtype


def test_columns_are_read_into_the_batch_itself():
    source, slot = Columns(), Recording()
    returned = spy(source)
    batch = run(source, slot)
    assert_batch(batch)
    assert len(slot.made) == 1 and all(batch[key] is slot.made[0][key] for key in ("x", "y", "id"))
    assert returned[0]["x"] is batch["x"]  # the source wrote the batch itself: no copy followed


def test_batches_kept_in_the_workers_memory_offer_no_allocator():
    source = Columns()
    assert_batch(run(source))
    assert source.given == [None]


@pytest.mark.parametrize(
    "ask",
    [
        lambda specs: {**specs, "id": ((3,), np.int64)},  # a column the batch names itself
        lambda specs: {**specs, "x": (specs["x"][0], np.dtype(">f8"))},  # another byte order
        lambda specs: {**specs, "x": ((2, 3), np.float64)},  # other than one row per id
        lambda specs: {**specs, "x": (specs["x"][0], np.dtype(object))},  # pointers: never in a slot
    ],
    ids=["id-column", "big-endian", "rows", "objects"],
)
def test_columns_the_batch_cannot_hold_as_they_are_get_fresh_arrays_and_are_copied(ask):
    source, slot = Columns(ask), Recording()
    batch = run(source, slot)  # "rows": the source's own read_batch fails, and the batch is read per sample
    assert_batch(batch)
    assert all(batch[key] is slot.made[-1][key] for key in ("x", "y", "id"))  # the copy went into the slot
    assert not any(column.dtype.hasobject for made in slot.made for column in made.values())


def test_image_folder_decodes_into_the_batch(tmp_path):
    for c, color in (("a", (200, 10, 10)), ("b", (10, 200, 10))):
        (tmp_path / c).mkdir()
        for k in range(3):
            Image.new("RGB", (16, 12), color).save(tmp_path / c / f"{k}.jpg", quality=95)
    source, slot = ImageFolder(str(tmp_path)), Recording()
    plain = source.read_batch(np.array([4, 0, 3]))
    returned = spy(source)
    batch = run(source, slot, ids=(4, 0, 3))
    np.testing.assert_array_equal(batch["x"], plain["x"])
    assert batch["y"].tolist() == [1, 0, 1] and batch["id"].tolist() == [4, 0, 3]
    assert len(slot.made) == 1 and returned[0]["x"] is slot.made[0]["x"] is batch["x"]  # decoded into it
    assert batch["x"].shape == (3, 12, 16, 3)


@pytest.mark.parametrize("first_order", ["<", ">"], ids=["native-first", "big-endian-first"])
def test_npy_pairs_read_into_the_batch_unless_a_file_needs_another_byte_order(tmp_path, first_order):
    from steadyfeed.sources.npy import NpyPairs

    for d in ("x", "y"):
        (tmp_path / d).mkdir()
    for i in range(6):
        order = first_order if i == 0 else "<"
        np.save(tmp_path / "x" / f"{i}.npy", np.full((2, 3), i, np.dtype(f"{order}f4")))
        np.save(tmp_path / "y" / f"{i}.npy", np.array([i * 10], np.int64))
    source, slot = NpyPairs(str(tmp_path / "x"), str(tmp_path / "y")), Recording()
    returned = spy(source)
    batch = run(source, slot, ids=(0, 4, 2))
    assert batch["x"].dtype == np.float32 and batch["x"].dtype.isnative
    assert batch["x"][:, 0, 0].tolist() == [0.0, 4.0, 2.0] and batch["y"][:, 0].tolist() == [0, 40, 20]
    assert len(slot.made) == 1 and all(batch[key] is slot.made[0][key] for key in ("x", "y", "id"))
    # native: read into the slot itself; big-endian first: into fresh arrays, copied in native order
    assert (returned[0]["x"] is slot.made[0]["x"]) == (first_order == "<")
    assert returned[0]["x"].dtype.str == f"{first_order}f4"


def test_a_pack_of_images_half_held_decoded_reads_into_the_batch(tmp_path):
    import steadyfeed as sf
    from steadyfeed.sources.tfrecord import TFRecordSource

    tree = tmp_path / "photos"
    for c, color in (("a", (200, 10, 10)), ("b", (10, 200, 10))):
        (tree / c).mkdir(parents=True)
        for k in range(3):
            Image.new("RGB", (16, 12), (color[0], color[1] + 20 * k, 30)).save(tree / c / f"{k}.jpg", quality=95)
    folder = ImageFolder(str(tree))
    packed = folder.from_encoded(
        TFRecordSource(sf.pack(folder.encoded(decoded=0.5), tmp_path / "pack", progress=False))
    )
    slot, returned = Recording(), spy(packed)
    batch = run(packed, slot, ids=(5, 0, 3, 2))
    assert packed.decoded.holds(np.array([5, 0, 3, 2])).any() and not packed.decoded.holds(np.array([5, 0, 3, 2])).all()
    np.testing.assert_array_equal(batch["x"], np.stack([folder[i]["x"] for i in (5, 0, 3, 2)]))
    assert batch["y"].tolist() == [1, 0, 1, 0]
    assert len(slot.made) == 1 and returned[0]["x"] is slot.made[0]["x"] is batch["x"]  # decoded into it
    packed.close()


def test_hdf5_rows_are_read_into_the_batch_in_the_order_asked(tmp_path):
    import h5py

    from steadyfeed.sources.hdf5 import Hdf5Source

    images = np.arange(10 * 4 * 3, dtype=np.uint8).reshape(10, 4, 3)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("images", data=images, chunks=(4, 4, 3))
        f.create_dataset("labels", data=np.arange(10) * 10)
    source, slot = Hdf5Source(str(tmp_path / "d.h5"), x="/images", y="/labels"), Recording()
    returned = spy(source)
    batch = run(source, slot, ids=(7, 2, 9, 2, 3))
    np.testing.assert_array_equal(batch["x"], images[[7, 2, 9, 2, 3]])
    assert batch["y"].tolist() == [70, 20, 90, 20, 30] and batch["id"].tolist() == [7, 2, 9, 2, 3]
    assert len(slot.made) == 1 and returned[0]["x"] is slot.made[0]["x"] is batch["x"]  # read into it
    source.close()


@pytest.mark.parametrize("mapped", [False, True], ids=["in-memory", "memmap"])
def test_array_rows_are_gathered_into_the_batch(tmp_path, mapped):
    from steadyfeed import ArraySource

    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    if mapped:
        np.save(tmp_path / "x.npy", x)
        x = np.load(tmp_path / "x.npy", mmap_mode="r")
    source, slot = ArraySource(x=x, y=np.arange(10) * 10), Recording()
    returned = spy(source)
    batch = run(source, slot, ids=(7, 2, 9, 2, 3))
    np.testing.assert_array_equal(batch["x"], np.asarray(x)[[7, 2, 9, 2, 3]])
    assert batch["y"].tolist() == [70, 20, 90, 20, 30] and batch["id"].tolist() == [7, 2, 9, 2, 3]
    assert len(slot.made) == 1 and returned[0]["x"] is slot.made[0]["x"] is batch["x"]  # gathered into it
    with pytest.raises(IndexError, match="sample id 10 out of range for ArraySource of length 10"):
        source.read_batch(np.array([1, 10]), allocate=Recording())
    np.testing.assert_array_equal(source.read_batch(np.array([-1]), allocate=Recording())["x"], np.asarray(x)[[-1]])
