"""WebDatasetSource on shards the webdataset library's TarWriter writes, and on plain tar files
(Python's tarfile, the tar command): grouping, the cached member index, bad shards, exactly
once and bit-identical across workers and modes, decode_image on image members."""

import io
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from helpers import epoch_digest

from steadyfeed import DataError, Loader, decode_image
from steadyfeed.sources import webdataset as wds_source
from steadyfeed.sources.webdataset import WebDatasetSource

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.timeout(90)

PER_SHARD = 12
MODES = [(0, "thread"), (2, "thread"), (2, "process")]


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), i % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def sample(i: int) -> dict:
    return {"__key__": f"part/{i:05d}", "png": png(i), "cls": str(i % 3).encode(), "meta.json": b'{"i": %d}' % i}


@pytest.fixture
def shards(tmp_path):
    """shard-000.tar and shard-001.tar, written by webdataset.TarWriter, 12 samples each."""
    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"shard-{s:03d}.tar")) as sink:
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                sink.write(sample(i))
    return tmp_path


def label_of(batch) -> np.ndarray:
    return np.array([int(v) for v in batch["cls"]])


def to_xy(sample: dict, rng) -> dict:  # module level: process workers import it
    return {"x": decode_image(sample["png"]), "y": np.int64(int(sample["cls"]))}


def test_reads_what_webdataset_writes_as_webdataset_reads_it(shards):
    src = WebDatasetSource(str(shards / "shard-{000..001}.tar"))
    theirs = list(wds.WebDataset(str(shards / "shard-{000..001}.tar"), shardshuffle=False))
    assert len(src) == len(theirs) == 2 * PER_SHARD
    for i, expected in enumerate(theirs):
        assert src[i] == {k: v for k, v in expected.items() if not k.startswith("__")}
    assert src.locate(13).startswith(f"{shards / 'shard-001.tar'} sample 'part/00013'")
    src.close()


def test_plain_tar_shards_read_alike(tmp_path):
    folder = tmp_path / "files" / "part"
    folder.mkdir(parents=True)
    for i in range(4):
        for ext, data in sample(i).items():
            if ext != "__key__":
                (folder / f"{i:05d}.{ext}").write_bytes(data)
    with tarfile.open(tmp_path / "py.tar", "w") as tar:  # Python's tarfile, members in name order
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=f"part/{path.name}")
    tar_command = shutil.which("tar")
    if tar_command:
        subprocess.run(
            [tar_command, "--sort=name", "-cf", str(tmp_path / "gnu.tar"), "part"], cwd=tmp_path / "files", check=True
        )
    for name in ("py.tar", "gnu.tar") if tar_command else ("py.tar",):
        src = WebDatasetSource(tmp_path / name)
        assert len(src) == 4 and src[2] == {k: v for k, v in sample(2).items() if k != "__key__"}, name


def test_keys_select_and_require_members(shards):
    src = WebDatasetSource(shards, keys={"image": "jpg;png", "label": "cls"})
    assert src[5] == {"image": png(5), "label": b"2"}
    assert WebDatasetSource(shards, keys=["cls"])[4] == {"cls": b"1"}
    with pytest.raises(
        DataError,
        match=r"shard-000.tar sample 'part/00003' .*: expected a member 'txt', the sample "
        r"has \['cls', 'meta.json', 'png'\]",
    ):
        WebDatasetSource(shards, keys=["txt"])[3]


@pytest.mark.parametrize("workers,mode", MODES)
def test_exactly_once_and_bit_identical_across_workers_and_modes(shards, workers, mode, no_leaks):
    def run(w, m):
        with Loader(
            WebDatasetSource(shards, keys=["png", "cls"]),
            5,
            transform=to_xy,
            shuffle=True,
            seed=2,
            workers=w,
            mode=m,
            with_ids=True,
        ) as loader:
            return list(loader)

    batches = run(workers, mode)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(2 * PER_SHARD))
    for b in batches:  # the image (all pixels = id) with its own label
        assert (b["x"][:, 0, 0, 0] == b["id"]).all() and (b["y"] == b["id"] % 3).all()
    assert epoch_digest(batches) == epoch_digest(run(0, "thread"))


def test_the_member_index_is_cached_and_rebuilt_when_the_shard_changes(shards, monkeypatch):
    path = shards / "shard-000.tar"
    scans = []
    real = wds_source._scan_shard
    monkeypatch.setattr(wds_source, "_scan_shard", lambda p: scans.append(p) or real(p))
    WebDatasetSource(path)
    WebDatasetSource(path)
    assert scans == [str(path)] and os.path.exists(f"{path}.sfidx.npy")
    with wds.TarWriter(str(path)) as sink:  # rewritten with fewer samples
        for i in range(3):
            sink.write(sample(i))
    assert len(WebDatasetSource(path)) == 3 and len(scans) == 2


def test_a_cut_shard_reads_its_good_samples_then_names_the_byte(shards, no_leaks):
    path = shards / "shard-001.tar"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])  # cut inside a member
    src = WebDatasetSource(shards)
    good = len(src) - 1 - PER_SHARD  # samples of shard-001 before the cut
    assert 0 < good < PER_SHARD
    assert src[PER_SHARD + good - 1]["cls"] == str((PER_SHARD + good - 1) % 3).encode()
    with pytest.raises(
        DataError,
        match=rf"shard-001.tar: the tar stream breaks at byte \d+: .*; the {good} "
        r"sample\(s\) before it read",
    ):
        src[PER_SHARD + good]
    src.close()
    with Loader(
        WebDatasetSource(shards, keys=["cls"]), 4, workers=2, mode="process", on_error="skip", with_ids=True
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        report = loader.quarantine_report()
    assert sorted(ids.tolist()) == list(range(PER_SHARD + good))
    assert [e["sample_id"] for e in report] == [PER_SHARD + good] and "shard-001.tar at byte" in report[0]["location"]


def test_a_corrupt_header_or_garbage_is_named(shards, tmp_path):
    data = bytearray((shards / "shard-000.tar").read_bytes())
    second = data.index(b"part/00001") // 512 * 512  # the first header of sample 1
    bad = bytes(data[: second + 100]) + b"\x13" + bytes(data[second + 101 :])  # breaks its checksum
    (tmp_path / "bad.tar").write_bytes(bad)
    src = WebDatasetSource(tmp_path / "bad.tar")
    assert len(src) == 2 and src[0]["cls"] == b"0"
    with pytest.raises(
        DataError,
        match=r"bad.tar: the tar stream breaks at byte \d+: no valid tar header at byte "
        r"\d+ \(bad checksum\)",
    ):
        src[1]
    (tmp_path / "junk.tar").write_bytes(bytes(data) + b"not a tar member" * 64)
    with pytest.raises(DataError, match="bytes that are not zeros follow tar's end-of-archive marker"):
        (junk := WebDatasetSource(tmp_path / "junk.tar"))[len(junk) - 1]
    (tmp_path / "z.tar").write_bytes(b"\x1f\x8b" + bytes(100))
    with pytest.raises(DataError, match="z.tar is gzip-compressed: .*decompress it first"):
        WebDatasetSource(tmp_path / "z.tar")
    (tmp_path / "notes.tar").write_bytes(b"just some text, not a tar file" * 40)
    with pytest.raises(DataError, match=r"notes.tar: the tar stream breaks at byte 0: .*no sample before it"):
        WebDatasetSource(tmp_path / "notes.tar")


def test_a_sample_holding_an_extension_twice_is_named(tmp_path):
    with tarfile.open(tmp_path / "dup.tar", "w") as tar:
        for name in ("a.cls", "a.cls", "b.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    src = WebDatasetSource(tmp_path / "dup.tar")
    assert len(src) == 2 and src[1] == {"cls": b"1"}
    with pytest.raises(DataError, match=r"dup.tar sample 'a' .*holds 'cls' twice"):
        src[0]
