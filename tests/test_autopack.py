"""Automatic packing (issue 17, item 5): Loader(..., pack_to=DIR) packs a small-file source in
the background during the first epoch and reads the shards from then on and in later runs,
with bit-identical batches; a changed source gets a new pack; a half-written pack is never read."""

import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from helpers import HeldInPacker, RefusedInPacker, epoch_digest, noisy
from hypothesis import given, settings
from hypothesis import strategies as st

import steadyfeed as sf
from steadyfeed import Loader
from steadyfeed.autopack import NICENESS
from steadyfeed.integration.callbacks import epoch_figures
from steadyfeed.pack_process import START_NICENESS

pytest.importorskip("google_crc32c")

pytestmark = pytest.mark.timeout(300)


def npy_pairs(root, n=120):
    for key in ("x", "y"):
        (root / key).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(root / "x" / f"{i:04d}.npy", np.arange(12, dtype=np.float32).reshape(3, 4) * i)
        np.save(root / "y" / f"{i:04d}.npy", np.int64(i % 5))
    return sf.NpyPairs(root / "x", root / "y")


def packs(root):
    """The entries under a pack_to directory, hidden ones (staging) included."""
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def run_epochs(loader, epochs=3, wait=True):
    """(what it read, digest) per epoch; after epoch 0, waits for the pack (``wait``)."""
    out = []
    for e in range(epochs):
        digest = epoch_digest(loader.epoch(e))
        out.append((loader.reading, digest))
        if e == 0 and wait:
            assert loader.wait_for_pack(120), loader.stats()["pack"]
    return out


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_the_first_epoch_reads_files_later_ones_the_pack_bit_identically(tmp_path, workers, mode, no_leaks):
    source = npy_pairs(tmp_path / "data")
    kw = dict(shuffle=True, seed=4, transform=noisy, with_ids=True, workers=workers, mode=mode)
    with Loader(source, 16, **kw) as plain:
        reference = [epoch_digest(plain.epoch(e)) for e in range(3)]
    with Loader(source, 16, pack_to=tmp_path / "packs", **kw) as loader:
        digests = []
        for e in range(3):
            before = loader.stats()
            digests.append(epoch_digest(loader.epoch(e)))
            after = loader.stats()
            figures = epoch_figures(before, after, 1.0)
            assert after["reading"] == ("files" if e == 0 else "pack")
            assert figures["data_from_pack"] == (0.0 if e == 0 else 1.0)  # what LoaderMonitor logs
            if e == 0:
                assert loader.wait_for_pack(120), loader.stats()["pack"]
        assert loader.stats()["pack"]["state"] == "ready" and loader.stats()["pack_batches"] == 2 * len(loader)
    assert digests == reference
    assert len(packs(tmp_path / "packs")) == 1  # one pack, no staging left behind

    with Loader(source, 16, pack_to=tmp_path / "packs", **kw) as later:  # a later run: the pack from epoch 0
        got = [epoch_digest(later.epoch(e)) for e in range(3)]
        assert later.reading == "pack" and later.stats()["pack_batches"] == 3 * len(later)
    assert got == reference


def test_a_changed_source_gets_a_new_pack(tmp_path):
    source = npy_pairs(tmp_path / "data", 40)
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        run_epochs(loader, 1)
    first = packs(tmp_path / "packs")
    np.save(tmp_path / "data" / "x" / "0007.npy", np.full((3, 4), -1, np.float32))  # one file rewritten
    changed = sf.NpyPairs(tmp_path / "data" / "x", tmp_path / "data" / "y")
    with Loader(changed, 8, pack_to=tmp_path / "packs", with_ids=True) as loader:
        assert [r for r, _ in run_epochs(loader, 2)] == ["files", "pack"]  # the old pack is not this data
        batch = next(b for b in loader.epoch(2) if 7 in b["id"])
        np.testing.assert_array_equal(batch["x"][list(batch["id"]).index(7)], np.full((3, 4), -1, np.float32))
    assert len(packs(tmp_path / "packs")) == 2 and set(first) < set(packs(tmp_path / "packs"))


def test_a_half_written_or_foreign_pack_is_never_read(tmp_path):
    source = npy_pairs(tmp_path / "data", 30)
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        run_epochs(loader, 1)
    (key,) = packs(tmp_path / "packs")
    (tmp_path / "packs" / key / "source.json").write_text('{"identity": "someone else", "samples": 30}')
    (tmp_path / "packs" / f".{key}.partial-123-abcd").mkdir()  # what a killed writer leaves
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        assert [r for r, _ in run_epochs(loader, 2)] == ["files", "pack"]  # rebuilt, then read
    assert key in packs(tmp_path / "packs")
    (tmp_path / "packs" / key / "source.json").unlink()  # a pack without its identity: as good as absent
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        assert loader.stats()["pack"]["state"] == "absent"
        run_epochs(loader, 1)


class Gated:
    """NpyPairs whose sample ``at`` blocks the packer thread until ``gate`` opens (module-level)."""

    def __init__(self, inner, at, gate):
        self.inner, self.at, self.gate = inner, at, gate

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.at and threading.current_thread().name == "steadyfeed-pack_to":
            self.gate.wait(60)
        return self.inner[i]

    def fingerprint(self):
        return "gated:" + self.inner.fingerprint()


def test_close_during_the_build_leaves_nothing_behind(tmp_path, no_leaks):
    gate = threading.Event()
    source = Gated(npy_pairs(tmp_path / "data", 60), at=30, gate=gate)
    loader = Loader(source, 8, pack_to=tmp_path / "packs")
    list(loader.epoch(0))  # the packer waits at sample 30
    assert loader.stats()["pack"]["state"] == "building"
    loader._autopack._stop.set()  # close() cancels first ...
    gate.set()  # ... so the packer's next read stops it
    loader.close()
    assert packs(tmp_path / "packs") == []  # no pack, no staging directory
    assert loader.stats()["pack"]["state"] == "absent" and "error" not in loader.stats()["pack"]


def held_source(tmp_path, n=60):
    """A source the packer's child process stops inside of (``helpers.HeldInPacker``)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    return HeldInPacker(npy_pairs(tmp_path / "data", n), at=n // 2, marks=str(marks)), marks


def wait_for(path, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_the_pack_is_built_in_a_child_process_and_close_ends_it(tmp_path, no_leaks):
    source, marks = held_source(tmp_path)
    loader = Loader(source, 8, pack_to=tmp_path / "packs")
    list(loader.epoch(0))
    wait_for(marks / "reached")  # the child stands inside sample 30, in its own process
    assert loader.stats()["pack"]["state"] == "building" and loader.stats()["pack"]["packer"] == "process"
    # its imports (and the source's unpickling) ran below the workers' priority, its packing runs at the lowest
    parent = os.nice(0)
    assert int((marks / "unpickled").read_text()) == min(19, parent + START_NICENESS)
    assert int((marks / "reached").read_text()) == min(19, parent + NICENESS)
    loader.close()  # ends the child: no_leaks finds no process left
    assert packs(tmp_path / "packs") == [] and not list(tmp_path.glob(".*partial*"))
    assert loader.stats()["pack"]["state"] == "absent" and "error" not in loader.stats()["pack"]


def test_the_packer_process_ends_when_its_loaders_process_is_killed(tmp_path):
    source, marks = held_source(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(
        "import pickle, sys, time\n"
        "from steadyfeed import Loader\n"
        f"source = pickle.loads({pickle.dumps(source)!r})\n"
        f"loader = Loader(source, 8, pack_to={str(tmp_path / 'packs')!r})\n"
        "list(loader.epoch(0))\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    train = subprocess.Popen([sys.executable, str(script)], env=env)
    packer = None
    try:
        wait_for(marks / "reached")  # the packer stands inside sample 30
        (packer,) = psutil.Process(train.pid).children()
        assert any("steadyfeed.pack_process" in arg for arg in packer.cmdline())
        train.kill()  # no close(), no atexit: only the lifeline tells the child
        train.wait(60)
        packer.wait(120)  # psutil.TimeoutExpired (a failure) if the child outlived it
    finally:
        train.kill()
        train.wait(60)
        (marks / "go").touch()  # a child that outlived it (the failure above) finishes, and exits
        if packer is not None and packer.is_running():
            packer.kill()


def test_a_source_that_does_not_pickle_is_packed_by_a_thread(tmp_path):
    gate = threading.Event()
    gate.set()
    source = Gated(npy_pairs(tmp_path / "data", 20), at=5, gate=gate)  # an Event does not pickle
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        assert [r for r, _ in run_epochs(loader, 2)] == ["files", "pack"]
        assert loader.stats()["pack"]["packer"].startswith("thread: the source does not pickle")


def test_a_source_the_child_cannot_unpickle_is_packed_by_a_thread(tmp_path, no_leaks):
    source = RefusedInPacker(npy_pairs(tmp_path / "data", 20))
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        assert [r for r, _ in run_epochs(loader, 2)] == ["files", "pack"]
        assert loader.stats()["pack"]["packer"].startswith("thread: the source does not unpickle in a child process")


def test_a_sample_that_fails_to_read_abandons_the_pack_and_the_files_go_on(tmp_path, no_leaks):
    source = npy_pairs(tmp_path / "data", 40)
    with open(tmp_path / "data" / "x" / "0013.npy", "r+b") as f:
        f.truncate(100)  # cut inside the data
    with Loader(source, 8, pack_to=tmp_path / "packs", on_error="skip", workers=2) as loader:
        list(loader.epoch(0))
        assert not loader.wait_for_pack(120)
        list(loader.epoch(1))
        reads, report = [loader.reading], loader.stats()["pack"]
        assert reads == ["files"] and report["state"] == "failed" and "0013.npy" in report["error"]
        assert {e["sample_id"] for e in loader.quarantine_report()} == {13}
    assert packs(tmp_path / "packs") == []


def photos(root, n=10, **save):
    """``root/a`` and ``root/b``, ``n`` JPEG scenes each (Pillow's encoder)."""
    from images_made import scene

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for j in range(n):
            scene(j + (c == "b") * n).save(root / c / f"{j}.jpg", **{"quality": 85, **save})
    return root


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_pack_to_with_jpeg_images_is_bit_identical(tmp_path, workers, mode, no_leaks):
    kw = dict(shuffle=True, workers=workers, mode=mode, with_ids=True)
    images = sf.ImageFolder(photos(tmp_path / "photos"), size=(48, 40), fast=True)
    with Loader(images, 4, **kw) as plain:
        reference = [epoch_digest(plain.epoch(e)) for e in range(3)]
    with Loader(images, 4, pack_to=tmp_path / "packs", **kw) as loader:
        got = run_epochs(loader, 3)
    assert got == [("files", reference[0]), ("pack", reference[1]), ("pack", reference[2])]


def test_an_image_folder_is_packed_as_its_files_bytes_and_read_back_in_batches(tmp_path, monkeypatch):
    """The pack holds each file's bytes (a few KB), not its pixels; TensorFlow reads it as an
    ImageNet-style TFRecord; later epochs decode whole batches from it (never one by one)."""
    from steadyfeed.sources.packed_images import PackedImages
    from steadyfeed.sources.tfrecord import TFRecordSource

    images = sf.ImageFolder(photos(tmp_path / "photos"))
    with Loader(images, 8, pack_to=tmp_path / "packs", shuffle=True) as loader:
        list(loader.epoch(0))
        assert loader.wait_for_pack(120), loader.stats()["pack"]
        batched = []
        real = PackedImages.read_batch
        monkeypatch.setattr(PackedImages, "read_batch", lambda self, ids: batched.append(len(ids)) or real(self, ids))
        monkeypatch.setattr(PackedImages, "__getitem__", lambda *a: pytest.fail("a packed image was read alone"))
        list(loader.epoch(1))
        assert loader.reading == "pack" and sum(batched) == len(images)
    (pack,) = (tmp_path / "packs").glob("*/pack")
    records = TFRecordSource(pack)
    assert [records[i]["x"] for i in range(len(images))] == [open(p, "rb").read() for p in images.files]
    assert [int(records[i]["y"]) for i in range(len(images))] == images.labels.tolist()
    tf = pytest.importorskip("tensorflow")
    first = next(iter(tf.data.TFRecordDataset(sorted(map(str, pack.glob("*.tfrecord"))))))
    parsed = tf.io.parse_single_example(first, {"x": tf.io.FixedLenFeature([], tf.string)})
    np.testing.assert_array_equal(tf.io.decode_jpeg(parsed["x"], dct_method="INTEGER_ACCURATE").numpy(), images[0]["x"])


def test_a_corrupt_image_is_packed_and_named_by_its_file_when_read_from_the_pack(tmp_path, no_leaks):
    """A file that reads but does not decode does not abandon the pack (its bytes are stored):
    every epoch, from the files or the pack, quarantines that very image, named by its file."""
    root = photos(tmp_path / "photos", 6)
    bad = root / "b" / "2.jpg"
    bad.write_bytes(bad.read_bytes()[:300])  # a truncated JPEG
    images = sf.ImageFolder(root)
    with Loader(images, 4, pack_to=tmp_path / "packs", on_error="skip", max_error_fraction=0.5) as loader:
        reads = [r for r, _ in run_epochs(loader, 2)]
        report = loader.quarantine_report()
        assert reads == ["files", "pack"] and loader.stats()["pack"]["state"] == "ready"
    assert sorted((e["sample_id"], e["epoch"]) for e in report) == [(8, 0), (8, 1)]
    assert all(str(bad) in e["location"] and str(bad) in e["message"] for e in report), report
    with Loader(images, 4, pack_to=tmp_path / "packs") as strict:
        with pytest.raises(sf.SampleError, match="2.jpg"):
            list(strict.epoch(0))


def mixed_photos(root, n=6):
    """``photos`` plus a PNG and a grey JPEG in each class: Pillow's decoder and a conversion too."""
    from images_made import scene

    photos(root, n)
    for c, seed in (("a", 50), ("b", 51)):
        scene(seed).save(root / c / "p.png")
        scene(seed + 2).convert("L").save(root / c / "g.jpg", quality=90)
    return root


def pack_dir(root):
    (pack,) = root.glob("*/pack")
    return pack


def packed_folder(images, root):
    from steadyfeed.sources.tfrecord import TFRecordSource

    return images.from_encoded(TFRecordSource(pack_dir(root)))


@pytest.mark.parametrize(
    "workers,mode,decoded", [(0, "thread", 0.5), (2, "thread", 0.5), (2, "process", 0.5), (2, "thread", 1.0)]
)
def test_a_pack_holding_decoded_images_is_bit_identical_to_the_folder(tmp_path, workers, mode, decoded, no_leaks):
    """pack_decoded: that share of the images, spread evenly over the ids, is held decoded
    beside the shards; every epoch from the pack is the folder's, bit for bit, in batches and
    one image at a time."""
    from steadyfeed.sources.decoded_pixels import stores_decoded

    kw = dict(shuffle=True, workers=workers, mode=mode, with_ids=True)
    images = sf.ImageFolder(mixed_photos(tmp_path / "photos"), size=(48, 40), fast=True)
    with Loader(images, 4, **kw) as plain:
        reference = [epoch_digest(plain.epoch(e)) for e in range(3)]
    with Loader(images, 4, pack_to=tmp_path / "packs", pack_decoded=decoded, **kw) as loader:
        got = run_epochs(loader, 3)
        assert loader.stats()["pack_batches"] == 2 * len(loader) and loader.stats()["pack"]["decoded"] == decoded
    assert got == [("files", reference[0]), ("pack", reference[1]), ("pack", reference[2])]

    packed = packed_folder(images, tmp_path / "packs")
    held = packed.decoded.holds(np.arange(len(images))).tolist()
    assert held == [stores_decoded(i, decoded) for i in range(len(images))]
    assert sum(held) == int(len(images) * decoded)
    for i in range(len(images)):
        one = packed[i]["x"]
        np.testing.assert_array_equal(one, images[i]["x"])
        assert one.flags.writeable
    packed.close()


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 10_000), st.integers(1, 64))
def test_the_share_held_decoded_is_spread_evenly_over_any_run_of_ids(share, start, length):
    """Any run of ids (a stretch of a shuffled epoch's samples is such a run in expectation;
    a batch of the unshuffled order is one) holds the share to within one image."""
    from steadyfeed.sources.decoded_pixels import stores_decoded

    held = sum(stores_decoded(i, share) for i in range(start, start + length))
    assert abs(held - share * length) < 1 + 1e-9


def test_a_pack_holding_decoded_images_has_the_shards_of_a_pack_of_bytes(tmp_path):
    """The decoded share lies beside the shards, which are byte for byte those of a pack
    without it: tools that read the pack (tf.data, tests above) read it as before."""
    images = sf.ImageFolder(photos(tmp_path / "photos", 3))
    shards = []
    for decoded in (0.0, 0.5):
        with Loader(images, 4, pack_to=tmp_path / f"packs{decoded}", pack_decoded=decoded) as loader:
            list(loader.epoch(0))
            assert loader.wait_for_pack(120), loader.stats()["pack"]
        pack = pack_dir(tmp_path / f"packs{decoded}")
        shards.append({p.name: p.read_bytes() for p in pack.glob("*.tfrecord")})
    assert shards[0] == shards[1] and shards[0]
    assert sorted(p.name for p in pack.iterdir() if "decoded" in p.name) == [
        "decoded.json",
        "decoded.npy",
        "decoded.pixels",
    ]


def test_an_image_that_fails_to_decode_is_not_held_decoded_and_is_named_when_read(tmp_path, no_leaks):
    root = photos(tmp_path / "photos", 6)
    bad = root / "b" / "2.jpg"
    bad.write_bytes(bad.read_bytes()[:300])  # a truncated JPEG
    images = sf.ImageFolder(root)
    kw = dict(pack_to=tmp_path / "packs", pack_decoded=1.0)
    with Loader(images, 4, on_error="skip", max_error_fraction=0.5, **kw) as loader:
        reads = [r for r, _ in run_epochs(loader, 2)]
        report = loader.quarantine_report()
    assert reads == ["files", "pack"]
    assert sorted((e["sample_id"], e["epoch"]) for e in report) == [(8, 0), (8, 1)]
    assert all(str(bad) in e["location"] and str(bad) in e["message"] for e in report), report
    packed = packed_folder(images, tmp_path / "packs")
    assert np.flatnonzero(~packed.decoded.holds(np.arange(len(images)))).tolist() == [8]
    packed.close()
    with Loader(images, 4, **kw) as strict:
        with pytest.raises(sf.SampleError, match="2.jpg"):
            list(strict.epoch(0))


def test_damaged_decoded_images_are_refused_naming_the_file_and_the_image(tmp_path):
    images = sf.ImageFolder(photos(tmp_path / "photos", 2), size=(48, 40))
    with Loader(images, 4, pack_to=tmp_path / "packs", pack_decoded=1.0) as loader:
        list(loader.epoch(0))
        assert loader.wait_for_pack(120), loader.stats()["pack"]
    pixels = pack_dir(tmp_path / "packs") / "decoded.pixels"
    data = bytearray(pixels.read_bytes())
    data[48 * 40 * 3 + 7] ^= 1  # in image 1
    pixels.write_bytes(bytes(data))
    packed = packed_folder(images, tmp_path / "packs")
    with pytest.raises(sf.DataError, match=rf"{pixels}: the decoded pixels of image 1 .*CRC mismatch"):
        packed[1]
    with pytest.raises(sf.DataError, match="CRC mismatch"):
        packed.read_batch([0, 1])
    np.testing.assert_array_equal(packed.read_batch([3, 0])["x"], np.stack([images[3]["x"], images[0]["x"]]))
    pixels.write_bytes(bytes(data[: 48 * 40 * 3 * 3 + 5]))  # image 3 cut short
    with pytest.raises(sf.DataError, match="the decoded pixels of image 3 .*only 5 bytes there"):
        packed.read_batch([3])
    packed.close()
    with pytest.raises(sf.DataError, match=r"decoded with \{'size': \[48, 40\], 'channels': 3, 'fast': False"):
        packed_folder(sf.ImageFolder(images.root, size=(48, 40), fast=True), tmp_path / "packs")
    np.save(pixels.with_suffix(".npy"), np.zeros(3))
    with pytest.raises(sf.DataError, match="decoded.npy describes"):
        packed_folder(images, tmp_path / "packs")
    about = pixels.with_suffix(".json")
    about.write_text(about.read_text().replace("steadyfeed.decoded/1", "steadyfeed.decoded/9"))
    with pytest.raises(sf.DataError, match="format 'steadyfeed.decoded/9', this steadyfeed reads"):
        packed_folder(images, tmp_path / "packs")


def test_a_packer_thread_writes_the_decoded_share_too(tmp_path, monkeypatch, no_leaks):
    import steadyfeed.autopack as autopack

    def no_child(*args, **kwargs):
        raise autopack.NotPortable("no child in this test")

    monkeypatch.setattr(autopack, "Packing", no_child)
    images = sf.ImageFolder(photos(tmp_path / "photos", 3))
    with Loader(images, 4, shuffle=True, pack_to=tmp_path / "packs", pack_decoded=1.0, with_ids=True) as loader:
        digests = run_epochs(loader, 2)
        assert loader.stats()["pack"]["packer"] == "thread: no child in this test"
    with Loader(images, 4, shuffle=True, with_ids=True) as plain:
        assert [d for _, d in digests] == [epoch_digest(plain.epoch(e)) for e in range(2)]
    packed = packed_folder(images, tmp_path / "packs")
    assert packed.decoded.holds(np.arange(len(images))).all()
    packed.close()


def test_pack_of_a_folder_holding_a_share_decoded_reads_back_bit_identically(tmp_path):
    """The library's own pack() writes the decoded share too (inside its atomic directory),
    and the folder's from_encoded reads it back."""
    from steadyfeed.sources.tfrecord import TFRecordSource

    images = sf.ImageFolder(mixed_photos(tmp_path / "photos", 3), channels=1)
    out = sf.pack(images.encoded(decoded=0.5), tmp_path / "packed", progress=False)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("decoded")) == [
        "decoded.json",
        "decoded.npy",
        "decoded.pixels",
    ]
    packed = images.from_encoded(TFRecordSource(out))
    assert packed.decoded.holds(np.arange(len(images))).sum() == len(images) // 2
    ids = np.random.default_rng(0).permutation(len(images))
    np.testing.assert_array_equal(packed.read_batch(ids)["x"], np.stack([images[i]["x"] for i in ids]))
    packed.close()


def test_the_decoded_share_is_part_of_the_packs_identity(tmp_path):
    """Another share, or other refusal limits with pixels packed, is another pack; with none
    decoded the identity is the one packs of bytes always had, so those packs stay valid."""
    from steadyfeed.autopack import AutoPack

    root = photos(tmp_path / "photos", 2)
    images = sf.ImageFolder(root)
    keys = {
        "bytes": AutoPack(tmp_path, images).directory,
        "half": AutoPack(tmp_path, images, 0.5).directory,
        "all": AutoPack(tmp_path, images, 1.0).directory,
        "half, other limit": AutoPack(tmp_path, sf.ImageFolder(root, max_pixels=10**6), 0.5).directory,
        "bytes, other limit": AutoPack(tmp_path, sf.ImageFolder(root, max_pixels=10**6)).directory,
    }
    assert len(set(keys.values()) - {keys["bytes"]}) == 3 and keys["bytes, other limit"] == keys["bytes"]
    assert AutoPack(tmp_path, images).identity["stored"] == "encoded"


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(pack_to="/tmp/never-made", pack_decoded=1.5), r"pack_decoded must be a share of the images in \[0, 1\]"),
        (dict(pack_to="/tmp/never-made", pack_decoded=True), "pack_decoded must be a share"),
        (dict(pack_decoded=0.5), "give pack_to=DIR too"),
    ],
)
def test_pack_decoded_is_checked(options, message):
    with pytest.raises(ValueError, match=message):
        Loader(sf.ArraySource(x=np.zeros(3)), 2, **options)


def test_a_loader_holding_images_decoded_is_audited_from_its_source(tmp_path):
    """What the commands read (a loader's source as stored, never its pack) drops pack_to and
    pack_decoded together."""
    from steadyfeed.tools.spec import raw_loader

    images = sf.ImageFolder(photos(tmp_path / "photos", 3))
    with Loader(images, 4, pack_to=tmp_path / "packs", pack_decoded=0.5) as loader:
        with raw_loader(loader) as raw:
            assert raw.config.execution.pack_to is None and raw.config.execution.pack_decoded == 0.0
            assert np.concatenate([b["id"] for b in raw.epoch(0)]).tolist() == list(range(len(images)))


def test_pack_decoded_is_refused_for_a_source_packed_as_its_samples(tmp_path):
    with pytest.raises(ValueError, match="pack_decoded=0.5 stores decoded images .* NpyPairs is packed as its samples"):
        Loader(npy_pairs(tmp_path / "data", 4), 2, pack_to=tmp_path / "packs", pack_decoded=0.5)


def test_a_source_without_a_fingerprint_is_refused():
    with pytest.raises(ValueError, match="pack_to needs a source with fingerprint"):
        Loader(sf.ArraySource(x=np.zeros(3)), 2, pack_to="/tmp/never-made")


def test_shards_go_to_the_kernels_readahead_only_when_they_fit_in_memory(tmp_path, monkeypatch):
    from steadyfeed import autopack

    source = npy_pairs(tmp_path / "data", 20)
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        run_epochs(loader, 1)
    shards = sorted((tmp_path / "packs").glob("*/pack/*.tfrecord"))
    assert shards and autopack.prefetch(shards)
    monkeypatch.setattr(autopack, "available_memory", lambda: sum(p.stat().st_size for p in shards))  # 2x too little
    assert not autopack.prefetch(shards)


def test_the_readahead_advice_runs_beside_the_epoch_and_ends_with_the_loader(tmp_path, monkeypatch, no_leaks):
    """Advising a pack's windows takes seconds for a large one: it runs in a thread of its own,
    so an epoch from the pack is read while the advice is still being given (here: held back
    until the loader closes), and closing the loader ends it."""
    from steadyfeed import autopack

    source = npy_pairs(tmp_path / "data", 20)
    with Loader(source, 8, pack_to=tmp_path / "packs") as loader:
        run_epochs(loader, 1)
        assert loader.wait_for_pack(60)
    began, ended = threading.Event(), threading.Event()

    def advice_held_back(paths, stop):
        began.set()
        assert stop.wait(60)  # set by close()
        ended.set()

    monkeypatch.setattr(autopack, "prefetch", advice_held_back)
    loader = Loader(source, 8, pack_to=tmp_path / "packs", with_ids=True)
    try:
        ids = np.concatenate([b["id"] for b in loader.epoch(1)])  # while the advice is held back
        assert loader.reading == "pack" and sorted(ids.tolist()) == list(range(20))
        assert began.wait(60) and not ended.is_set()  # the thread may start late on a busy machine
    finally:
        loader.close()
    assert ended.is_set()  # close() waited for it


def test_the_readahead_is_given_what_an_epoch_reads_the_smallest_file_first(tmp_path, monkeypatch):
    from steadyfeed import autopack

    advised, asked, real = [], [], autopack.prefetch

    def spy(paths, stop):
        advised.append([os.path.basename(p) for p in paths])
        asked.append(real(paths, stop))  # absent if it raised (in its thread)

    monkeypatch.setattr(autopack, "prefetch", spy)
    images = sf.ImageFolder(photos(tmp_path / "photos", 3))
    for decoded in (0.0, 0.5, 1.0):
        with Loader(images, 4, pack_to=tmp_path / f"packs{decoded}", pack_decoded=decoded) as loader:
            run_epochs(loader, 2)
    shard = "shard-00000-of-00001.tfrecord"
    assert advised == [[shard], [shard, "decoded.pixels"], ["decoded.pixels"]]
    assert asked == [sys.platform.startswith("linux")] * 3


def test_the_advice_stops_at_the_next_window_once_asked_to(tmp_path, monkeypatch):
    from steadyfeed import autopack

    shard = tmp_path / "shard.tfrecord"
    shard.write_bytes(bytes(10 * autopack.PREFETCH_CHUNK))
    stop, windows = threading.Event(), []

    def advise(fd, offset, length, advice):
        windows.append(offset)
        if len(windows) == 3:
            stop.set()

    monkeypatch.setattr(os, "posix_fadvise", advise)
    assert autopack.prefetch([shard], stop)
    assert windows == [0, autopack.PREFETCH_CHUNK, 2 * autopack.PREFETCH_CHUNK]


def resident_fraction(path) -> float:
    """The share of ``path``'s pages in the page cache (``mincore`` on a private mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # writable: ctypes needs its address
    start = ctypes.c_char.from_buffer(mapping)
    try:
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec) / pages
    finally:
        del start
        mapping.close()


def cold_shard(tmp_path):
    """A 40 MB file (past any readahead window) out of the page cache, or a skip where the file
    system keeps files in memory."""
    shard = tmp_path / "shard.tfrecord"
    shard.write_bytes(np.random.default_rng(0).bytes(40 * 2**20))
    fd = os.open(shard, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if resident_fraction(shard) > 0.5:
        pytest.skip("this file system keeps the file in memory (tmpfs?): nothing to prefetch")
    return shard


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore are Linux's")
def test_a_shard_goes_to_the_page_cache_whole_not_only_its_first_readahead_window(tmp_path):
    """One WILLNEED for a whole file reads only about the device's readahead window (128 KB by
    default, 8 MB on some disks): a 34 MB pack was left three quarters on the disk."""
    from steadyfeed import autopack

    shard = cold_shard(tmp_path)
    assert autopack.prefetch([shard])
    assert resident_fraction(shard) == 1.0  # on its return: it waited for the reads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore are Linux's")
def test_a_shard_goes_to_the_page_cache_whole_where_the_kernel_drops_the_advice(tmp_path, monkeypatch):
    """Advice is free to be dropped (a CI machine left 3% of a 40 MB file on the disk for a
    minute after advising every window): the reads that follow it bring in the rest."""
    from steadyfeed import autopack

    shard = cold_shard(tmp_path)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: None)  # every window dropped
    assert autopack.prefetch([shard])
    assert resident_fraction(shard) == 1.0


def test_later_epochs_without_a_transform_read_the_pack_in_batches_bit_identically(tmp_path, monkeypatch):
    """No transform: the files are read through NpyPairs.read_batch, the pack through
    TFRecordSource.read_batch (never one sample at a time), and the batches are the same."""
    from steadyfeed.sources.tfrecord import TFRecordSource

    source = npy_pairs(tmp_path / "data")
    kw = dict(shuffle=True, seed=2, with_ids=True, workers=0)
    with Loader(source, 16, **kw) as plain:
        reference = [epoch_digest(plain.epoch(e)) for e in range(3)]
    with Loader(source, 16, pack_to=tmp_path / "packs", **kw) as loader:
        digests = [epoch_digest(loader.epoch(0))]
        assert loader.wait_for_pack(120), loader.stats()["pack"]
        batched = []
        real = TFRecordSource.read_batch
        monkeypatch.setattr(TFRecordSource, "read_batch", lambda self, ids: batched.append(len(ids)) or real(self, ids))
        for name in ("__getitem__", "read_many"):
            monkeypatch.setattr(TFRecordSource, name, lambda *a: pytest.fail("a packed sample was read one by one"))
        digests += [epoch_digest(loader.epoch(e)) for e in (1, 2)]
        assert loader.reading == "pack" and sum(batched) == 2 * len(source)
    assert digests == reference
