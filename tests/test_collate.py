"""The collation policy: samples that each read fine are never charged for disagreeing.

``collate="stack"`` (the default) raises one CollateError naming both samples, their files and
layouts, under any on_error, quarantining nothing; ``collate="pad"`` pads each batch to its
largest shape and adds "<key>_shape"; byte order is normalised. On messy data written by the
real writers (``messy.py``), at workers 0, 2 threads and 2 processes."""

import hashlib
import pickle

import messy
import numpy as np
import pytest
from helpers import identity
from hypothesis import given, settings
from hypothesis import strategies as st

from steadyfeed import CollateError, Loader, SampleError
from steadyfeed.execution.batch import SHAPE_SUFFIX
from steadyfeed.sources.base import close_source

pytestmark = pytest.mark.timeout(120)

SETTINGS = [(0, "thread"), (2, "thread"), (2, "process")]
BATCH = 4


# -- the cases -----------------------------------------------------------------------------------
def images(tmp_path):
    from steadyfeed.sources.images import ImageFolder

    pytest.importorskip("PIL")
    return ImageFolder(messy.image_tree(tmp_path / "images"))


def vlen(tmp_path):
    pytest.importorskip("h5py")
    from steadyfeed.sources.hdf5 import Hdf5Source

    return Hdf5Source(messy.vlen_hdf5(tmp_path / "names.h5"), x="/names", y="/y")


def big_endian(tmp_path):
    from steadyfeed import NpyPairs

    return NpyPairs(*messy.npy_pairs(tmp_path))


CASES = {"images": images, "vlen": vlen, "big_endian": big_endian}


def run(source, workers, mode, **options):
    """(batches delivered, the CollateError or None, the quarantine report) of one epoch."""
    batches, error = [], None
    with Loader(
        source,
        BATCH,
        shuffle=True,
        seed=11,
        with_ids=True,
        workers=workers,
        mode=mode,
        max_error_fraction=1.0,
        **options,
    ) as loader:
        try:
            for batch in loader:
                batches.append(batch)
        except CollateError as exc:
            error = exc
        return batches, error, loader.quarantine_report()


def digest(batches) -> str:
    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            h.update(f"{key}{batch[key].dtype.str}{batch[key].shape}".encode())
            h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()


def expected(source, i) -> dict:
    return {k: np.asarray(v) for k, v in source[i].items()}


# -- stack ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize(
    "case,found", [("images", {"shape (24, 32, 3) uint8", "shape (50, 70, 3) uint8"}), ("vlen", None)]
)
def test_stack_raises_one_collate_error_naming_both_samples_and_quarantines_nothing(
    tmp_path, case, found, on_error, no_leaks
):
    source = CASES[case](tmp_path)
    seen = []
    for workers, mode in SETTINGS:
        batches, error, quarantined = run(source, workers, mode, on_error=on_error)
        assert error is not None and quarantined == []  # no sample is charged
        assert not isinstance(error, SampleError)
        a, b = error.sample_ids
        assert error.locations == (source.locate(a), source.locate(b))
        assert str(a) in str(error) and str(b) in str(error) and all(w in str(error) for w in error.locations)
        assert all(f in str(error) for f in error.found) and "collate='pad'" in str(error)
        seen.append((error.sample_ids, error.batch_index, str(error), digest(batches)))
    assert seen[1:] == seen[:1] * 2  # the same error at the same batch, the same batches before it
    if case == "images":
        assert messy.ODD_IMAGE.split("/")[1] in str(seen[0][2]) and set(error.found) == found
        assert "size=" in str(error)
    else:
        assert {f.split()[-1][:2] for f in error.found} == {"|S"} and error.found[0] != error.found[1]
        assert "strings of different lengths" in str(error)


@pytest.mark.parametrize("transform", [None, identity], ids=["batched read", "sample by sample"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_big_endian_file_among_native_ones_is_read_in_native_order(tmp_path, on_error, transform, no_leaks):
    source = big_endian(tmp_path)
    digests = set()
    for workers, mode in SETTINGS:
        batches, error, quarantined = run(source, workers, mode, on_error=on_error, transform=transform)
        assert error is None and quarantined == []
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(len(source)))
        for batch in batches:
            assert batch["x"].dtype == np.dtype("float32") and batch["x"].dtype.isnative
            for row, i in enumerate(batch["id"]):
                np.testing.assert_array_equal(batch["x"][row], np.arange(12, dtype=np.float32).reshape(3, 4) + i)
        digests.add(digest(batches))
    assert len(digests) == 1


# -- pad -----------------------------------------------------------------------------------------
def assert_padded(batch: dict, source) -> None:
    """Each row is its sample within its true shape, zeros beyond; "<key>_shape" holds that shape."""
    for row, i in enumerate(batch["id"]):
        for key, want in expected(source, int(i)).items():
            got = batch[key][row]
            if want.ndim:
                assert batch[key + SHAPE_SUFFIX][row].tolist() == list(want.shape)
                inside = tuple(slice(0, d) for d in want.shape)
                np.testing.assert_array_equal(got[inside], want)
                rest = np.ones(got.shape, bool)
                rest[inside] = False
                assert not got[rest].any()
            else:
                assert key + SHAPE_SUFFIX not in batch  # nothing to pad: no true-shape key
                assert got == want


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("case", list(CASES))
def test_pad_delivers_every_sample_once_with_its_true_shape_bit_identical_across_modes(
    tmp_path, case, on_error, no_leaks
):
    source = CASES[case](tmp_path)
    digests = set()
    for workers, mode in SETTINGS:
        batches, error, quarantined = run(source, workers, mode, on_error=on_error, collate="pad")
        assert error is None and quarantined == []
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(len(source)))
        for batch in batches:
            assert_padded(batch, source)
        digests.add(digest(batches))
    close_source(source)  # assert_padded read it in this process
    assert len(digests) == 1
    if case == "images":  # the batch with the 50x70 image is padded to it, the others are not
        sizes = {b["x"].shape[1:3] for b in batches}
        assert sizes == {messy.SIZE, messy.ODD_SIZE}
    if case == "vlen":
        names = [n.decode() for b in batches for n in b["x"]]
        assert sorted(names) == sorted(messy.NAMES)  # strings padded to the widest, nothing cut


@pytest.mark.parametrize("collate,size", [("stack", messy.SIZE), ("pad", None)])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_on_a_messy_tree_only_the_unreadable_file_is_lost(tmp_path, collate, size, on_error, no_leaks):
    from steadyfeed.sources.images import ImageFolder

    pytest.importorskip("PIL")
    source = ImageFolder(messy.image_tree(tmp_path / "images", notes=True, empty_file=True), size=size)
    empty = source.files.index(str(tmp_path / "images" / "dogs" / "empty.png"))
    assert not any(f.endswith(".txt") for f in source.files)  # notes.txt is no image
    for workers, mode in SETTINGS:
        if on_error == "raise":
            with (
                pytest.raises(SampleError) as info,
                Loader(source, BATCH, shuffle=True, seed=11, workers=workers, mode=mode, collate=collate) as loader,
            ):
                list(loader)
            assert info.value.sample_id == empty and "empty.png" in str(info.value)
            assert "empty file" in str(info.value) and "BytesIO" not in str(info.value)
            continue
        batches, error, quarantined = run(source, workers, mode, on_error="skip", collate=collate)
        assert error is None and [q["sample_id"] for q in quarantined] == [empty]
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == [i for i in range(len(source)) if i != empty]


# -- the rules, on constructed samples ----------------------------------------------------------
class Samples:
    """A source serving the given list of sample dicts."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_keys_that_differ_dtypes_that_differ_and_a_clashing_shape_key_raise_under_pad_too():
    cases = [
        ([{"x": np.zeros(2)}, {"x": np.zeros(2), "z": np.zeros(1)}], "keys", "same keys"),
        ([{"x": np.zeros(2, np.float32)}, {"x": np.zeros(3, np.float64)}], "dtype", "does not cast"),
        ([{"x": np.zeros(2)}, {"x": np.zeros((2, 1))}], "ndim", "same number of dimensions"),
        ([{"x": np.zeros(2), "x_shape": np.zeros(1)}] * 2, "name", "rename"),
    ]
    for samples, what, fix in cases:
        for on_error in ("raise", "skip"):
            with Loader(Samples(samples), 2, collate="pad", on_error=on_error) as loader:
                with pytest.raises(CollateError, match=fix) as info:
                    list(loader)
                assert loader.quarantine_report() == []
            assert info.value.sample_ids[0] == 0, what


def test_stack_is_exact_and_a_collate_error_pickles_with_its_fields():
    with pytest.raises(CollateError) as info:
        list(Loader(Samples([{"x": np.zeros(2, np.float32)}, {"x": np.zeros(2, np.float64)}]), 2))
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.sample_ids, err.key, err.batch_index, err.collate) == ((0, 1), "x", 0, "stack")
    assert err.found == ("shape (2,) float32", "shape (2,) float64") and str(err) == str(info.value)
    assert "astype" in str(err)


def test_collate_is_an_option_of_the_loader_its_replace_and_the_command_line():
    from steadyfeed.tools.spec import LOADER_FLAGS

    loader = Loader(Samples([{"x": np.zeros(1)}]), 1)
    assert loader.config.read.collate == "stack"
    assert loader.replace(collate="pad").config.read.collate == "pad"
    assert LOADER_FLAGS["collate"]["choices"] == ("stack", "pad")
    with pytest.raises(ValueError, match="collate must be one of"):
        Loader(Samples([]), 1, collate="ragged")


ragged = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.text("ab", max_size=4)), min_size=1, max_size=9)


@settings(max_examples=40, deadline=None)
@given(ragged, st.integers(1, 4), st.sampled_from(["partial", "pad"]))
def test_pad_keeps_every_value_and_zeroes_the_rest(rows, batch_size, last_batch):
    samples = [
        {"x": np.arange(1, a * b + 1, dtype=np.int16).reshape(a, b) * (i + 1), "s": np.str_(text), "y": np.int64(i)}
        for i, (a, b, text) in enumerate(rows)
    ]
    with Loader(Samples(samples), batch_size, collate="pad", last_batch=last_batch, with_ids=True) as loader:
        seen = []
        for batch in loader:
            real = batch["id"] >= 0
            assert batch["x"].shape[1:] == tuple(batch["x_shape"][real].max(axis=0))
            assert "s_shape" not in batch and "y_shape" not in batch
            assert_padded({k: v[real] for k, v in batch.items()}, Samples(samples))
            seen += batch["id"][real].tolist()
    assert seen == list(range(len(samples)))


@pytest.mark.timeout(300)  # the session's first TensorFlow import can take minutes on a loaded machine
def test_tf_signature_leaves_padded_dimensions_open():
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    from steadyfeed.integration.tf_dataset import output_signature

    samples = [{"x": np.zeros((i + 1, 2), np.float32), "y": np.int64(i)} for i in range(4)]
    spec = output_signature(Loader(Samples(samples), 2, collate="pad"))
    assert spec["x"].shape.as_list() == [None, None, None] and spec["y"].shape.as_list() == [None]
    assert spec["x_shape"].shape.as_list() == [None, 2] and spec["x_shape"].dtype == tf.int64
    fixed = output_signature(Loader(Samples([{"x": np.zeros((2, 2), np.float32)}] * 4), 2))
    assert fixed["x"].shape.as_list() == [None, 2, 2]
