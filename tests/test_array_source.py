"""ArraySource over memory maps: larger-than-memory arrays travel to workers by path, not by copy."""

import pickle

import numpy as np
import pytest
from helpers import label_of

from steadyfeed import ArraySource, Loader

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def mapped(tmp_path):
    x = np.arange(2000 * 8, dtype=np.float32).reshape(2000, 8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", label_of(x))
    return np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")


def test_memmaps_pickle_as_paths(mapped):
    x, y = mapped
    blob = pickle.dumps(ArraySource(x=x, y=y))
    assert len(blob) < 2000  # the 64 KB of data did not travel
    back = pickle.loads(blob)
    assert isinstance(back.arrays["x"], np.memmap)
    np.testing.assert_array_equal(back[1234]["x"], x[1234])


def test_a_memmap_slice_travels_as_data_with_the_right_rows(mapped):
    x, _ = mapped
    back = pickle.loads(pickle.dumps(ArraySource(x=x[100:200])))
    np.testing.assert_array_equal(back.arrays["x"], x[100:200])


def test_process_workers_read_memmaps(mapped, no_leaks):
    x, y = mapped
    with Loader(ArraySource(x=x, y=y), 64, shuffle=True, workers=2, mode="process", with_ids=True) as loader:
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(2000))
    for b in batches:
        np.testing.assert_array_equal(b["y"], label_of(b["x"]))


def test_structured_memmap_keeps_its_dtype(tmp_path):
    a = np.zeros(5, dtype=[("a", "<i4"), ("b", "<f8")])
    a["b"] = np.arange(5)
    np.save(tmp_path / "s.npy", a)
    back = pickle.loads(pickle.dumps(ArraySource(s=np.load(tmp_path / "s.npy", mmap_mode="r"))))
    assert back.arrays["s"].dtype == a.dtype
    assert back[3]["s"]["b"] == 3.0
