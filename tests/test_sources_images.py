"""ImageFolder: labels from folders, every pixel format to uint8 HxWxC, untrusted files refused, Loader-ready."""

import os
import pickle
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from steadyfeed import CollateError, DataError, Loader, SampleError
from steadyfeed.sources import images
from steadyfeed.sources.images import ImageFolder

pytestmark = pytest.mark.timeout(60)

MODES = [(2, "thread"), (2, "process")]


# -- making files ---------------------------------------------------------------------------
def gradient(h, w):
    """A smooth RGB image (JPEG keeps it close); every pixel differs from its neighbours."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) * 255 // (h + w)], -1).astype(
        np.uint8
    )


def save(path, image, **options):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    (Image.fromarray(image) if isinstance(image, np.ndarray) else image).save(path, **options)
    return str(path)


def png_bytes(width, height, bit_depth, color_type, raw=b""):
    """A PNG written by hand: any header, whatever the pixel data."""

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def jpeg_claiming(path, height, width):
    """A tiny valid JPEG whose frame header (SOF0) is patched to claim height x width."""
    save(path, gradient(8, 8), quality=90)
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(data)
    return str(path)


def one_image_folder(tmp_path, name, image, **options):
    """root/only/<name>, so that sample 0 is that image."""
    save(tmp_path / "root" / "only" / name, image, **options)
    return tmp_path / "root"


@pytest.fixture
def jpeg_calls(monkeypatch):
    """The keyword arguments of every simplejpeg.decode_jpeg call ImageFolder makes."""
    calls, real = [], images.simplejpeg.decode_jpeg
    monkeypatch.setattr(
        images.simplejpeg, "decode_jpeg", lambda data, *a, **kw: calls.append(kw) or real(data, *a, **kw)
    )
    return calls


# -- layout and labels -----------------------------------------------------------------------
def test_class_folders_sorted_become_labels_and_files_are_found_recursively_in_order(tmp_path):
    tiny = gradient(4, 4)
    for rel in ["dog/b.png", "dog/A.JPG", "ant/x.bmp", "cat/deep/er/z.gif", "cat/m.webp", "cat/n.tiff"]:
        save(tmp_path / rel, tiny)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "cat" / "._m.jpg").write_bytes(b"macOS resource fork, not an image")
    save(tmp_path / ".hidden" / "h.png", tiny)
    (tmp_path / "README.md").write_text("a file at the root is not a class")
    src = ImageFolder(tmp_path)
    assert src.classes == ["ant", "cat", "dog"]
    assert src.class_to_label == {"ant": 0, "cat": 1, "dog": 2}
    assert [os.path.relpath(f, tmp_path) for f in src.files] == [
        "ant/x.bmp",
        "cat/deep/er/z.gif",
        "cat/m.webp",
        "cat/n.tiff",
        "dog/A.JPG",
        "dog/b.png",
    ]
    assert src.labels.tolist() == [0, 1, 1, 1, 2, 2]
    assert [int(src[i]["y"]) for i in range(len(src))] == [0, 1, 1, 1, 2, 2]
    assert src[5]["y"].dtype == np.int64 and src.locate(4) == str(tmp_path / "dog" / "A.JPG")


@pytest.mark.parametrize(
    "layout,error",
    [(None, FileNotFoundError), ([], DataError), (["loose.png"], DataError), (["a/x.png", "b/notes.txt"], DataError)],
)
def test_missing_root_empty_root_no_class_folders_or_an_empty_class_are_refused(tmp_path, layout, error):
    root = tmp_path / "root"
    for rel in layout or []:
        save(root / rel, gradient(4, 4), format="PNG")
    if layout is not None:
        root.mkdir(exist_ok=True)
    with pytest.raises(error, match="expected") as info:
        ImageFolder(root)
    assert str(root) in str(info.value)
    if layout and len(layout) == 2:
        assert str(root / "b") in str(info.value)  # names the class folder without images


# -- pixels ----------------------------------------------------------------------------------
def test_rgb_jpeg_round_trip_is_close_to_the_source_pixels(tmp_path):
    pixels = gradient(48, 64)
    x = ImageFolder(one_image_folder(tmp_path, "a.jpg", pixels, quality=95))[0]["x"]
    assert x.shape == (48, 64, 3) and x.dtype == np.uint8 and x.flags.writeable
    diff = np.abs(x.astype(int) - pixels)
    assert diff.mean() < 2 and diff.max() < 24


def test_jpeg_is_decoded_by_simplejpeg_not_pillow(tmp_path, jpeg_calls, monkeypatch):
    root = one_image_folder(tmp_path, "a.jpg", gradient(16, 16))
    monkeypatch.setattr(images.Image, "open", lambda *a, **kw: pytest.fail("Pillow opened a JPEG"))
    assert ImageFolder(root)[0]["x"].shape == (16, 16, 3)
    assert len(jpeg_calls) == 1


def test_grayscale_jpeg_gives_three_equal_channels(tmp_path):
    gray = gradient(32, 32)[..., 0]
    x = ImageFolder(one_image_folder(tmp_path, "g.jpg", gray, quality=95))[0]["x"]
    assert x.shape == (32, 32, 3)
    assert np.array_equal(x[..., 0], x[..., 1]) and np.array_equal(x[..., 0], x[..., 2])
    assert np.abs(x[..., 0].astype(int) - gray).mean() < 2


def test_png_alpha_is_dropped_for_rgb_and_kept_for_four_channels(tmp_path):
    rgba = np.concatenate([gradient(10, 12), np.arange(120, dtype=np.uint8).reshape(10, 12, 1)], -1)
    root = one_image_folder(tmp_path, "a.png", rgba)
    np.testing.assert_array_equal(ImageFolder(root)[0]["x"], rgba[..., :3])
    np.testing.assert_array_equal(ImageFolder(root, channels=4)[0]["x"], rgba)
    gray = np.asarray(Image.fromarray(rgba[..., :3]).convert("L"))[..., None]
    np.testing.assert_array_equal(ImageFolder(root, channels=1)[0]["x"], gray)


@pytest.mark.parametrize("kind", ["gray", "rgb"])
def test_16_bit_png_is_scaled_to_8_bits_not_clipped(tmp_path, kind):
    ramp = (np.arange(256, dtype=np.uint16) * 257).reshape(1, 256).repeat(3, axis=0)  # 0 .. 65535
    if kind == "gray":
        path = save(tmp_path / "root" / "c" / "a.png", Image.fromarray(ramp))  # Pillow writes I;16 as 16-bit PNG
    else:
        rows = b"".join(b"\x00" + np.stack([row] * 3, -1).astype(">u2").tobytes() for row in ramp)
        path = tmp_path / "root" / "c" / "a.png"
        path.parent.mkdir(parents=True)
        path.write_bytes(png_bytes(256, 3, 16, 2, rows))
    x = ImageFolder(tmp_path / "root")[0]["x"]
    expected = (ramp >> 8).astype(np.uint8)  # the gradient survives: 0, 1, ..., 255
    for c in range(3):
        np.testing.assert_array_equal(x[..., c], expected)


@pytest.mark.filterwarnings("error")  # Pillow warns when a palette with per-entry alpha goes straight to RGB
@pytest.mark.parametrize(
    "fmt,transparency",
    [("png", bytes([255, 128, 255, 0])), ("gif", 3)],
    ids=["png-alpha-per-entry", "gif-one-transparent-index"],
)
def test_palette_image_gives_its_palette_colours(tmp_path, fmt, transparency):
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]], np.uint8)
    index = np.arange(24, dtype=np.uint8).reshape(4, 6) % 4
    pal = Image.fromarray(index, "P")
    pal.putpalette(colours.ravel().tolist())
    x = ImageFolder(one_image_folder(tmp_path, f"p.{fmt}", pal, transparency=transparency))[0]["x"]
    np.testing.assert_array_equal(x, colours[index])


def test_cmyk_jpeg_goes_to_pillow_and_gives_rgb(tmp_path, jpeg_calls):
    cmyk = Image.new("CMYK", (16, 8), (0, 255, 255, 0))  # pure red
    x = ImageFolder(one_image_folder(tmp_path, "c.jpg", cmyk, quality=95))[0]["x"]
    assert x.shape == (8, 16, 3)
    assert np.abs(x.astype(int) - [255, 0, 0]).max() <= 4
    assert jpeg_calls == []


def test_resize_uses_dct_scaling_for_large_jpegs_then_an_exact_resize(tmp_path, jpeg_calls):
    pixels = gradient(256, 192)
    root = one_image_folder(tmp_path, "big.jpg", pixels, quality=95)
    x = ImageFolder(root, size=(32, 40))[0]["x"]
    assert x.shape == (32, 40, 3)
    assert [{k: kw[k] for k in ("min_height", "min_width", "min_factor")} for kw in jpeg_calls] == [
        {"min_height": 32, "min_width": 40, "min_factor": 2}
    ]
    reference = np.asarray(Image.fromarray(pixels).resize((40, 32), Image.Resampling.BILINEAR))
    assert np.abs(x.astype(int) - reference).mean() < 3
    assert ImageFolder(root, size=(32, 40), channels=1)[0]["x"].shape == (32, 40, 1)
    small = one_image_folder(tmp_path / "s", "small.png", gradient(10, 12))
    assert ImageFolder(small, size=(20, 30))[0]["x"].shape == (20, 30, 3)  # upscaling too


def test_images_of_different_sizes_without_size_give_the_loaders_collate_error(tmp_path):
    save(tmp_path / "c" / "a.png", gradient(8, 8))
    save(tmp_path / "c" / "b.png", gradient(8, 9))
    with Loader(ImageFolder(tmp_path), 2, on_error="skip") as loader:
        with pytest.raises(CollateError, match="size=") as info:
            list(loader)
    assert info.value.locations == (str(tmp_path / "c" / "a.png"), str(tmp_path / "c" / "b.png"))
    assert loader.quarantine_report() == []


# -- untrusted files -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["png", "jpg"])
def test_a_50k_by_50k_header_is_refused_fast_without_decoding(tmp_path, fmt):
    path = tmp_path / "root" / "c" / f"bomb.{fmt}"
    path.parent.mkdir(parents=True)
    if fmt == "png":
        path.write_bytes(png_bytes(50_000, 50_000, 8, 2, b"\x00" * 64))
    else:
        jpeg_claiming(path, 50_000, 50_000)
    src = ImageFolder(tmp_path / "root")
    # the file holds a header only: decoding would fail on missing data, so "pixels" proves the
    # refusal came from the header (decoding 2.5 G pixels would take minutes and 7.5 GB)
    with pytest.raises(DataError, match="pixels") as info:
        src[0]
    assert str(path) in str(info.value) and "50000" in str(info.value).replace(",", "")


@pytest.mark.parametrize("name", ["a.png", "a.jpg"])
def test_max_pixels_and_max_bytes_are_enforced(tmp_path, name):
    root = one_image_folder(tmp_path, name, gradient(100, 100))
    with pytest.raises(DataError, match="100x100 = 10,000 pixels, more than max_pixels=9,999"):
        ImageFolder(root, max_pixels=9_999)[0]
    with pytest.raises(DataError, match="larger than max_bytes=100"):
        ImageFolder(root, max_bytes=100)[0]
    assert ImageFolder(root, max_pixels=10_000)[0]["x"].shape == (100, 100, 3)


def test_a_file_read_in_short_pieces_is_read_whole(tmp_path, monkeypatch):
    """A read may return fewer bytes than asked (FUSE, NFS, a signal): the rest is read, and
    the image is the one a whole read gives."""
    root = one_image_folder(tmp_path, "a.jpg", gradient(64, 48))
    whole = ImageFolder(root)[0]["x"]
    read, calls = os.read, []

    def short_read(fd, n):
        calls.append(n)
        return read(fd, min(n, 100))

    monkeypatch.setattr(images.os, "read", short_read)
    assert np.array_equal(ImageFolder(root)[0]["x"], whole) and len(calls) > 5


@pytest.mark.parametrize("workers,mode", MODES)
def test_truncated_jpeg_raises_sample_error_naming_the_file_or_is_quarantined(tmp_path, workers, mode, no_leaks):
    noise = np.random.default_rng(0).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8)
    for k in range(9):
        save(tmp_path / "c" / f"{k}.jpg", noise[k])
    bad = tmp_path / "c" / "4.jpg"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size * 9 // 10])  # headers intact, scan data cut short
    bad = str(bad)
    src = ImageFolder(tmp_path)
    assert src.locate(4) == bad
    with Loader(src, 3, workers=workers, mode=mode) as loader, pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.location == bad and bad in str(info.value)
    assert isinstance(info.value.__cause__, DataError) and "Premature end of JPEG file" in str(info.value)
    with Loader(src, 3, workers=workers, mode=mode, with_ids=True, on_error="skip", max_error_fraction=0.5) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        report = loader.quarantine_report()
    assert sorted(ids.tolist()) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert [(r["sample_id"], r["location"], r["error_type"]) for r in report] == [(4, bad, "DataError")]


# -- names, links, workers -------------------------------------------------------------------
def test_non_ascii_names_work_and_pickle(tmp_path):
    path = save(tmp_path / "猫" / "ñandú é.jpg", gradient(8, 8))
    save(tmp_path / "Ünïcode" / "добрый день.png", gradient(8, 8))
    src = pickle.loads(pickle.dumps(ImageFolder(tmp_path)))
    assert src.classes == ["Ünïcode", "猫"] and src.locate(1) == path
    assert src[0]["x"].shape == src[1]["x"].shape == (8, 8, 3)


def test_symlinked_files_and_folders_are_followed_and_link_loops_end(tmp_path):
    outside = save(tmp_path / "elsewhere" / "real.png", gradient(6, 6))
    root = tmp_path / "root"
    save(root / "a" / "own.png", gradient(6, 6))
    os.symlink(outside, root / "a" / "linked.png")
    os.symlink(root / "a", root / "a" / "loop")  # would recurse forever if followed blindly
    os.symlink(tmp_path / "elsewhere", root / "b")  # a class folder that is a link
    src = ImageFolder(root)
    assert [os.path.relpath(f, root) for f in src.files] == ["a/linked.png", "a/own.png", "b/real.png"]
    np.testing.assert_array_equal(src[0]["x"], gradient(6, 6))
    assert src.labels.tolist() == [0, 0, 1]


@pytest.mark.parametrize("workers,mode", MODES)
def test_every_image_is_delivered_exactly_once_with_its_label(tmp_path, workers, mode, no_leaks):
    for c, name in enumerate(["bird", "fish", "frog"]):
        for k in range(7):
            pixels = np.roll(gradient(16, 16), 3 * k + c, axis=1)
            save(tmp_path / name / f"{k}.{'jpg' if k % 2 else 'png'}", pixels)
    src = ImageFolder(tmp_path)
    with Loader(src, 4, shuffle=True, seed=3, workers=workers, mode=mode, with_ids=True) as loader:
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(21))
    for b in batches:
        np.testing.assert_array_equal(b["y"], src.labels[b["id"]])
        np.testing.assert_array_equal(b["x"], np.stack([src[int(i)]["x"] for i in b["id"]]))


def test_fingerprint_changes_with_files_and_settings(tmp_path):
    path = save(tmp_path / "c" / "a.png", gradient(4, 4))
    before = ImageFolder(tmp_path).fingerprint()
    assert ImageFolder(tmp_path).fingerprint() == before
    assert ImageFolder(tmp_path, size=(2, 2)).fingerprint() != before
    os.utime(path, ns=(1, 1))
    assert ImageFolder(tmp_path).fingerprint() != before


class EncodedImages:
    """An ImageFolder's files as stored (the README's recipe): bytes and label, not pixels."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self):
        return len(self.folder)

    def __getitem__(self, i):
        with open(self.folder.files[i], "rb") as f:
            return {"image/encoded": f.read(), "image/class/label": self.folder.labels[i]}


def test_an_image_folder_packed_as_encoded_records_decodes_back_to_its_own_samples(tmp_path):
    import messy

    from steadyfeed import TFRecordSource, decode_image, pack

    folder = ImageFolder(messy.image_tree(tmp_path / "tree", per_class=3), size=(12, 16))
    src = TFRecordSource(pack(EncodedImages(folder), tmp_path / "packed", progress=False))
    assert src.specs["image/encoded"].dtype == "bytes" and len(src) == len(folder)
    for i in range(len(folder)):
        np.testing.assert_array_equal(decode_image(src[i]["image/encoded"], size=(12, 16)), folder[i]["x"])
        assert src[i]["image/class/label"] == folder[i]["y"]
    with pytest.raises(DataError, match="image bytes: empty"):
        decode_image(b"")
    with pytest.raises(TypeError, match="takes the encoded bytes"):
        decode_image(folder.files[0])  # a path is ImageFolder's job
    src.close()


# -- the DCT setting and batches decoded in place -------------------------------------------------
def photo_folder(root, n=6, side=40, **options):
    """``n`` noisy photo-like JPEGs (``side`` x ``side``, quality 90) in two classes."""
    rng = np.random.default_rng(7)
    for i in range(n):
        field = np.asarray(Image.fromarray(rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)).resize((side, side)))
        pixels = np.clip(field + rng.normal(0, 14, field.shape), 0, 255).astype(np.uint8)
        save(root / f"c{i % 2}" / f"{i}.jpg", pixels, quality=90, **options)
    return root


@pytest.mark.timeout(300)  # imports TensorFlow (minutes on a loaded machine)
@pytest.mark.parametrize("channels", [1, 3])
def test_fast_decodes_as_tf_decode_jpegs_default_and_the_default_as_its_accurate_dct(tmp_path, channels):
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed", exc_type=ImportError)
    root = photo_folder(tmp_path, subsampling=2)  # 4:2:0, where fancy upsampling shows
    fast, accurate = ImageFolder(root, channels=channels, fast=True), ImageFolder(root, channels=channels)
    differs = 0
    for i, path in enumerate(fast.files):
        data = open(path, "rb").read()
        np.testing.assert_array_equal(fast[i]["x"], tf.io.decode_jpeg(data, channels=channels).numpy())
        np.testing.assert_array_equal(
            accurate[i]["x"], tf.io.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE").numpy()
        )
        np.testing.assert_array_equal(images.decode_image(data, channels=channels, fast=True), fast[i]["x"])
        differs += not np.array_equal(fast[i]["x"], accurate[i]["x"])
    assert differs == len(fast)  # the two DCTs differ: the option reaches the decoder
    assert fast.fingerprint() != accurate.fingerprint() and "fast=True" in repr(fast)


def test_fast_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="fast must be True or False"):
        ImageFolder(photo_folder(tmp_path), fast="yes")


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("size", [None, (24, 32), (40, 40)])
def test_read_batch_gives_the_samples_stacked(tmp_path, size, fast):
    photo_folder(tmp_path / "r")
    save(tmp_path / "r" / "c0" / "big.jpg", gradient(96, 80), quality=90)  # DCT-scaled, then resized
    save(tmp_path / "r" / "c1" / "gray.jpg", gradient(40, 40)[..., 0], quality=90)
    save(tmp_path / "r" / "c1" / "png.png", gradient(40, 40))
    src = ImageFolder(tmp_path / "r", size=size, fast=fast)
    everything = list(range(len(src)))[::-1]  # out of order
    ids = [i for i in everything if "big" not in src.files[i]] if size is None else everything
    batch = src.read_batch(ids)
    assert batch["x"].dtype == np.uint8 and batch["x"].flags.c_contiguous and batch["x"].flags.writeable
    np.testing.assert_array_equal(batch["x"], np.stack([src[i]["x"] for i in ids]))
    np.testing.assert_array_equal(batch["y"], src.labels[ids])
    assert batch["y"].dtype == np.int64


def test_read_batch_decodes_jpegs_of_the_output_shape_into_the_batch(tmp_path, jpeg_calls):
    src = ImageFolder(photo_folder(tmp_path), size=(40, 40))
    batch = src.read_batch([0, 1, 2])
    buffers = [kw["buffer"] for kw in jpeg_calls]
    assert buffers[0] is None and all(np.shares_memory(b, batch["x"]) for b in buffers[1:])


def test_read_batch_refuses_an_image_of_another_shape_instead_of_broadcasting_it(tmp_path):
    save(tmp_path / "c" / "a.png", gradient(8, 9))
    save(tmp_path / "c" / "b.png", gradient(1, 9))  # (1, 9, 3) would broadcast into (8, 9, 3)
    src = ImageFolder(tmp_path)
    with pytest.raises(DataError, match=r"b\.png: decoded to \(1, 9, 3\), the batch's first image to \(8, 9, 3\)"):
        src.read_batch([0, 1])
    with pytest.raises(IndexError, match="out of range"):
        src.read_batch([0, 2])


def test_a_corrupt_jpeg_in_a_batch_read_in_place_is_named_and_the_rest_delivered(tmp_path):
    """read_batch raises; the loader then reads that batch image by image (workers: the truncated-JPEG test above)."""
    root = photo_folder(tmp_path, n=8)
    bad = root / "c1" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    src = ImageFolder(root)
    with pytest.raises(DataError, match="3.jpg"):
        src.read_batch(range(8))
    with Loader(src, 4, on_error="skip", max_error_fraction=0.5, with_ids=True) as loader:
        batches = list(loader)
    bad_id = list(src.files).index(str(bad))
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == sorted(set(range(8)) - {bad_id})
    assert [(r["sample_id"], r["location"]) for r in loader.quarantine_report()] == [(bad_id, str(bad))]
    for b in batches:
        np.testing.assert_array_equal(b["x"], np.stack([src[int(i)]["x"] for i in b["id"]]))
