"""Automatic packing (issue 17, item 5): Loader(..., pack_to=DIR) packs a small-file source in
the background during the first epoch and reads the shards from then on and in later runs,
with bit-identical batches; a changed source gets a new pack; a half-written pack is never read."""

import os
import threading

import numpy as np
import pytest
from helpers import epoch_digest, noisy

import steadyfeed as sf
from steadyfeed import Loader
from steadyfeed.integration.callbacks import epoch_figures

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


def test_pack_to_with_jpeg_images_is_bit_identical(tmp_path):
    from images_made import scene

    for c in ("a", "b"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for j in range(10):
            scene(j + (c == "b") * 10).save(tmp_path / "photos" / c / f"{j}.jpg", quality=85)
    images = sf.ImageFolder(tmp_path / "photos")
    with Loader(images, 4, shuffle=True) as plain:
        reference = [epoch_digest(plain.epoch(e)) for e in range(2)]
    with Loader(images, 4, shuffle=True, pack_to=tmp_path / "packs") as loader:
        got = run_epochs(loader, 2)
    assert got == [("files", reference[0]), ("pack", reference[1])]


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
