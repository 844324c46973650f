"""ImageFolder: ``root/<class>/**/<image>`` files, decoded to uint8 ``(h, w, channels)`` arrays.

Needs the ``images`` extra (Pillow and simplejpeg). JPEGs are decoded by simplejpeg
(libjpeg-turbo, which releases the GIL, so ``mode="thread"`` workers decode in parallel);
every other format, and JPEGs simplejpeg does not handle (CMYK, YCCK, unusual
subsampling), by Pillow. Without a transform a batch is decoded straight into its
array (``ImageFolder.read_batch``).

``fast=True`` picks libjpeg-turbo's fast integer DCT (fancy upsampling kept): the pixels of
``tf.io.decode_jpeg``'s default (``dct_method="INTEGER_FAST"``), bit for bit. The default,
``fast=False``, is the accurate integer DCT (``dct_method="INTEGER_ACCURATE"``, Pillow's
and Keras ``load_img``'s). On photo-like 128 x 128 JPEGs at quality 90 the fast DCT costs
a few hundredths of a dB of PSNR and decodes about 5% faster (``benchmarks/bench_sources.py``
prints both); a pixel differs by at most a few levels.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import DataError
from .base import Allocator, file_fingerprint
from .listing import RelativePaths, cached_listing, list_tree

if TYPE_CHECKING:
    from .packed_images import EncodedImages, PackedImages

try:
    import simplejpeg
    from PIL import Image, UnidentifiedImageError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("ImageFolder needs Pillow and simplejpeg: pip install 'steadyfeed[images]'") from exc

IMAGE_EXTENSIONS = frozenset(
    {
        ".jpg",
        ".jpeg",
        ".jpe",
        ".jfif",
        ".png",
        ".bmp",
        ".gif",
        ".webp",
        ".tif",
        ".tiff",
        ".ppm",
        ".pgm",
        ".pbm",
        ".pnm",
    }
)
MAX_PIXELS = 89_478_485  # Pillow's default Image.MAX_IMAGE_PIXELS (1 GiB of 32-bit pixels / 3)
MAX_BYTES = 256 * 2**20
RESAMPLE = Image.Resampling.BILINEAR  # Pillow's is antialiased when shrinking, like Keras' resizing

_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_JPEG_MODES = {1: "GRAY", 3: "RGB", 4: "RGBA"}
_SIMPLEJPEG_SOURCES = frozenset({"Gray", "YCbCr", "RGB"})  # header colorspaces simplejpeg converts correctly
# the modes Pillow gives 16-bit gray images (PNG, TIFF: "I;16*"; PGM: "I", scaled to 0..65535)
_WIDE_GRAY = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})


class ImageReader:
    """Decodes image files as ImageFolder's samples are (see its docstring for the pixels, the
    size and the refusals): ``load(path)`` the pixels, ``header(path)`` what the header says.
    Also what ``steadyfeed inspect`` reads images with, so it refuses what a loader refuses."""

    def __init__(
        self,
        size: Sequence[int] | None = None,
        channels: int = 3,
        *,
        max_pixels: int = MAX_PIXELS,
        max_bytes: int = MAX_BYTES,
        fast: bool = False,
    ) -> None:
        if channels not in _PIL_MODES:
            raise ValueError(f"channels must be 1, 3 or 4, got {channels!r}")
        if not isinstance(fast, bool):
            raise TypeError(f"fast must be True or False, got {fast!r}")
        self.size = _check_size(size)
        self.channels = channels
        self.max_pixels, self.max_bytes = int(max_pixels), int(max_bytes)
        self.fast = fast  # libjpeg-turbo's fast integer DCT (tf.io.decode_jpeg's default)

    @property
    def decoding(self) -> dict:
        """The settings that decide the pixels ``decode`` gives, and which images it refuses."""
        size = None if self.size is None else list(self.size)  # as JSON gives it back
        return {
            "size": size,
            "channels": self.channels,
            "fast": self.fast,
            "max_pixels": self.max_pixels,
            "max_bytes": self.max_bytes,
        }

    def header(self, path: str | os.PathLike[str]) -> ImageHeader:
        """What the header of one image file says, refused as ``load`` would refuse it for what
        the header shows (empty, over ``max_bytes``, not an image, over ``max_pixels``); the
        pixels are not decoded (``load`` also finds truncated or corrupt pixel data)."""
        data = self._bytes(path)
        try:
            with self._open(data, path) as image:
                self._check_pixels(path, *image.size)
                return ImageHeader(image.format or "", image.mode, image.height, image.width, len(image.getbands()))
        except DataError:
            raise
        except Exception as exc:  # untrusted bytes make decoders raise anything; name the file
            raise DataError(f"{path}: not a decodable image ({type(exc).__name__}: {exc})") from exc

    def output_shape(self, header: ImageHeader) -> tuple[int, int, int]:
        """The shape ``load`` gives an image with this header: ``size`` (or its own), ``channels``."""
        return (*(self.size or (header.height, header.width)), self.channels)

    def _bytes(self, path) -> bytes:
        data = _read(path, self.max_bytes)
        if not data:
            raise DataError(f"{path}: empty file (0 bytes); expected an image file")
        return data

    def load(self, path: str | os.PathLike[str]) -> np.ndarray:
        """One image file decoded as this folder's samples are (any path, not only ours)."""
        return self.decode(self._bytes(path), path)

    def decode(
        self, data: bytes, path: str | os.PathLike[str] = "image bytes", into: np.ndarray | None = None
    ) -> np.ndarray:
        """An encoded image (the bytes of a file) decoded as ``load`` decodes a file: the same
        decoders, size, channels and refusals; ``path`` names it in errors. ``into``: a
        writable C-contiguous uint8 array that libjpeg-turbo decodes into, and that is
        returned, when the image is a JPEG of exactly that shape (else a new array is
        returned and ``into`` is left alone); the pixels are the same either way."""
        if not data:
            raise DataError(f"{path}: empty (0 bytes); expected an encoded image")
        if len(data) > self.max_bytes:
            raise DataError(
                f"{path}: {len(data):,} bytes, more than max_bytes={self.max_bytes:,}; refused without decoding"
            )
        try:
            image: np.ndarray | Image.Image | None = self._jpeg(data, path, into) if data[:2] == b"\xff\xd8" else None
            if image is None:
                image = self._pillow(data, path)
            return self._finish(image)
        except DataError:
            raise
        except Exception as exc:  # untrusted bytes make decoders raise anything; name the file
            raise DataError(f"{path}: not a decodable image ({type(exc).__name__}: {exc})") from exc

    def _jpeg(self, data: bytes, path, into: np.ndarray | None = None) -> np.ndarray | None:
        """simplejpeg's strict decode, or None for the JPEGs Pillow should decode instead."""
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None  # a header libjpeg-turbo's fast path cannot describe: let Pillow judge it
        if colorspace not in _SIMPLEJPEG_SOURCES:
            return None
        self._check_pixels(path, width, height)
        min_h, min_w = self.size or (0, 0)
        # an image already of the output shape is not scaled: it can be decoded in place
        buffer = into if into is not None and into.shape == (height, width, self.channels) else None
        # scale factors under 2 decode slower than a full decode (simplejpeg's own advice)
        image = simplejpeg.decode_jpeg(
            data,
            _JPEG_MODES[self.channels],
            fastdct=self.fast,
            fastupsample=False,  # fancy upsampling, as tf.io.decode_jpeg and Pillow do
            min_height=min_h,
            min_width=min_w,
            min_factor=2,
            buffer=buffer,
        )
        return into if buffer is not None else image

    def _pillow(self, data: bytes, path) -> Image.Image:
        image = self._open(data, path)
        self._check_pixels(path, *image.size)
        return _convert(image, _PIL_MODES[self.channels])

    @staticmethod
    def _open(data: bytes, path) -> Image.Image:
        """Pillow's image of ``data``, its header read (not its pixels)."""
        try:
            return Image.open(io.BytesIO(data))
        except UnidentifiedImageError:  # Pillow's message names only our in-memory buffer
            raise DataError(
                f"{path}: not a decodable image (UnidentifiedImageError: no image format Pillow "
                f"reads starts with {data[:8]!r})"
            ) from None

    def _check_pixels(self, path, width: int, height: int) -> None:
        if width * height > self.max_pixels:
            raise DataError(
                f"{path}: header says {width}x{height} = {width * height:,} pixels, more than "
                f"max_pixels={self.max_pixels:,}; refused before decoding (a decompression bomb?)"
            )

    def _finish(self, image: np.ndarray | Image.Image) -> np.ndarray:
        """The exact output size and an (h, w, channels) array."""
        if isinstance(image, np.ndarray):
            if self.size is None or image.shape[:2] == self.size:
                return image
            image = Image.fromarray(image[..., 0] if self.channels == 1 else image)
        if self.size is not None and image.size != self.size[::-1]:
            image = image.resize(self.size[::-1], RESAMPLE)
        return np.array(image).reshape(image.height, image.width, self.channels)  # a writable copy


@functools.lru_cache(maxsize=64)
def _reader(size, channels: int, max_pixels: int, max_bytes: int, fast: bool) -> ImageReader:
    return ImageReader(size, channels, max_pixels=max_pixels, max_bytes=max_bytes, fast=fast)


def decode_image(
    data: bytes | bytearray | memoryview | np.ndarray,
    size: Sequence[int] | None = None,
    channels: int = 3,
    *,
    max_pixels: int = MAX_PIXELS,
    max_bytes: int = MAX_BYTES,
    fast: bool = False,
    where: str = "image bytes",
) -> np.ndarray:
    """Encoded image bytes (a JPEG, PNG, ... as stored in a TFRecord ``image/encoded`` feature, a
    WebDataset member or a Parquet binary column) as a uint8 ``(h, w, channels)`` array, decoded
    exactly as :class:`ImageFolder` decodes its files: libjpeg-turbo for JPEGs (GIL released),
    Pillow for the rest, gray / RGBA / CMYK / 16-bit converted, ``size=(h, w)`` resized,
    decompression bombs refused from the header (``max_pixels``), more than ``max_bytes``
    refused, ``fast=True`` the fast integer DCT (``tf.io.decode_jpeg``'s default; see the
    module docstring). ``data``: bytes, bytearray, memoryview or a numpy bytes / uint8 array. A corrupt
    or truncated image raises :class:`DataError`, naming ``where`` (e.g. the record)."""
    if isinstance(data, np.ndarray):
        data = data.tobytes() if data.dtype.kind in "uS" else data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"decode_image takes the encoded bytes, got {type(data).__name__}")
    size = None if size is None else tuple(size)
    return _reader(size, channels, int(max_pixels), int(max_bytes), fast).decode(bytes(data), where)


class ImageFolder(ImageReader):
    """A classification dataset laid out as ``root/<class name>/.../<image file>``.

    Sample ``i`` is ``{"x": uint8 array (h, w, channels), "y": int64 label}``.

    Guarantees:

    * **Labels**: the class sub-folders of ``root``, sorted by name, are labels 0, 1, ...
      (``classes``, ``class_to_label``). Images are found recursively under each class
      folder (by extension, case-insensitive), sorted by path: the same tree always gives
      the same ids. ``files[i]`` and ``labels[i]`` describe sample ``i``. Names starting
      with ``.`` are ignored (``.git``, macOS ``._x.jpg`` companions). Symlinked files and
      folders are followed; a folder reached twice within a class (a link loop, say) is
      listed once.
    * **Pixels**: ``channels`` 1, 3 or 4 (gray, RGB, RGBA), 8 bits each. Alpha is
      *dropped* for 1 or 3 channels (the stored colour is kept, as Keras ``load_img`` and
      torchvision do), kept for 4 (opaque images get alpha 255). 16-bit images are scaled
      to 8 bits (high byte), never clipped to white. Palette, CMYK and bilevel images are
      converted by Pillow. Multi-frame files (GIF, TIFF) give their first frame. EXIF
      orientation and ICC profiles are not applied: pixels are as stored. JPEGs use the
      accurate integer DCT, or with ``fast=True`` the fast one, bit-identical to
      ``tf.io.decode_jpeg``'s default (module docstring).
    * **Size**: with ``size=(h, w)`` every image is resized to exactly that (aspect ratio
      not kept). JPEGs that are at least twice as large are first DCT-scaled down while
      decoding (much cheaper), then resized exactly. Without ``size`` images keep their
      own size: a batch mixing sizes raises the loader's ``CollateError`` (naming both
      files; no image is skipped for it), or is padded under ``Loader(collate="pad")``.
    * **What is an image**: files whose extension is in ``extensions``; other files in the
      class folders (``notes.txt``) are left out (``scan_tree`` lists them, and
      ``steadyfeed inspect`` shows them as ignored). An empty file is refused by name.
    * **Untrusted files**: a file over ``max_bytes`` is refused without reading more than
      that; an image whose header claims more than ``max_pixels`` pixels is refused before
      any pixel memory is allocated (Pillow's own ``Image.MAX_IMAGE_PIXELS`` check also
      applies to the files Pillow decodes). A corrupt, truncated or unreadable file raises
      :class:`DataError` naming it from ``__getitem__`` (the loader's ``SampleError``,
      or a quarantine entry under ``on_error="skip"``); truncated JPEGs are never padded.
    * **Batches**: ``read_batch(ids)`` (what the loader reads a batch with when there is no
      transform) decodes JPEGs of the output shape straight into the batch array: the
      same pixels as ``self[i]``, one copy fewer. Any image that fails or has another
      shape makes it raise, and the loader then reads that batch one image at a time,
      which names the file.
    * Pickles as paths and settings (no open files) and is safe to call from many threads.

    Construction raises ``FileNotFoundError`` for a missing root and :class:`DataError`
    for a root without class folders or a class folder without images.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        size: Sequence[int] | None = None,
        channels: int = 3,
        *,
        extensions: Iterable[str] = IMAGE_EXTENSIONS,
        max_pixels: int = MAX_PIXELS,
        max_bytes: int = MAX_BYTES,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        fast: bool = False,
    ) -> None:
        super().__init__(size, channels, max_pixels=max_pixels, max_bytes=max_bytes, fast=fast)
        self.root = os.path.abspath(os.fspath(root))
        self.extensions = frozenset("." + e.lower().lstrip(".") for e in extensions)
        self.classes = _class_names(self.root)
        self.class_to_label = {name: label for label, name in enumerate(self.classes)}
        keep = _image_filter(self.extensions)
        options = "\0".join([*sorted(self.extensions), "", *self.classes])
        self._listing = cached_listing(
            self.root,
            "images",
            options,
            cache_dir=cache_dir,
            build=lambda: list_tree(self.root, self.classes, keep=keep, progress=progress),
        )
        counts = np.diff(self._listing.group_starts)
        if not counts.all():
            name = self.classes[int(np.flatnonzero(counts == 0)[0])]
            raise _no_images(os.path.join(self.root, name), self.extensions)

    @property
    def files(self) -> RelativePaths:
        """Each sample's file, as an absolute path (read from the compact listing on demand)."""
        return RelativePaths(self._listing, absolute=True)

    @property
    def labels(self) -> np.ndarray:
        """Each sample's label (int64), built on demand: the listing keeps only where classes start."""
        starts = self._listing.group_starts
        return np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts))

    def __len__(self) -> int:
        return len(self._listing)

    def _label(self, i: int) -> np.int64:
        return np.int64(np.searchsorted(self._listing.group_starts, i, side="right") - 1)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self._listing):
            raise IndexError(f"sample id {i} out of range for ImageFolder of length {len(self._listing)}")
        return {"x": self.load(self._listing.path(i)), "y": self._label(i)}

    def read_batch(self, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None) -> dict[str, np.ndarray]:
        """``{"x": (len(ids), h, w, channels) uint8, "y": int64 labels}``, decoded into one array
        (see the class docstring); raises when an image fails or differs in shape from the first.
        ``allocate``: where the arrays go (the source protocol's, ``sources/base.py``)."""
        ids = self.check_ids(ids)
        paths = self._listing.paths(ids)
        return decode_columns(self, ((self._bytes(p), p) for p in paths), self.labels_of(ids), allocate)

    def check_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``ids`` as int64, IndexError when one is out of range."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) and not (0 <= ids.min() and ids.max() < len(self._listing)):
            raise IndexError(f"sample ids {ids.min()}..{ids.max()} out of range for {len(self._listing)} images")
        return ids

    def labels_of(self, ids: np.ndarray) -> np.ndarray:
        """The int64 labels of sample ids ``ids`` (checked by the caller)."""
        return (np.searchsorted(self._listing.group_starts, ids, side="right") - 1).astype(np.int64)

    # -- what pack_to stores (autopack.py): the files' bytes, decoded when read back ----------
    def encoded(self, decoded: float = 0.0) -> EncodedImages:
        """This folder as ``Loader(pack_to=...)`` packs it: sample ``i`` is ``{"x": the bytes of
        file i, "y": its label}`` (``EncodedImages``), so a pack holds the files as they are
        (a JPEG's few KB, not its decoded pixels) and reading it back decodes as this folder does.
        ``decoded``: the share of the images whose pixels are packed too (``Loader(pack_decoded=...)``)."""
        from .packed_images import EncodedImages

        return EncodedImages(self, decoded)

    def from_encoded(self, records: Any) -> PackedImages:
        """This folder's samples read from ``records`` (a TFRecordSource of ``encoded()``'s
        samples): ``PackedImages``, equal to ``self[i]`` bit for bit."""
        from .packed_images import PackedImages

        return PackedImages(self, records)

    def locate(self, i: int) -> str:
        return self._listing.path(i)

    def fingerprint(self) -> str:
        """Changes when a file is added, removed, renamed or modified, or the output settings change."""
        # " fast" only when set: fingerprints (and the caches keyed by them) made before the option stay valid
        settings = f"ImageFolder size={self.size} channels={self.channels}{' fast' if self.fast else ''}\n".encode()
        return hashlib.sha256(settings + file_fingerprint(self.files).encode()).hexdigest()

    def __repr__(self) -> str:
        return (
            f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes, "
            f"size={self.size}, channels={self.channels}{', fast=True' if self.fast else ''})"
        )


ReadInto = Callable[[np.ndarray | None], np.ndarray]  # an image that reads itself into the given row, if it fits


def decode_batch(
    reader: ImageReader,
    encoded: Iterable[tuple[bytes | ReadInto, str]],
    n: int,
    empty: Callable[[tuple], np.ndarray] = lambda shape: np.empty(shape, np.uint8),
) -> np.ndarray:
    """``n`` encoded images (``(bytes, name)`` pairs) decoded by ``reader`` into one
    ``(n, h, w, channels)`` uint8 array (made by ``empty(shape)``), JPEGs of the output shape
    straight into their rows; the first image sets the shape, and one of another shape raises
    DataError naming it. An image given as a function is read by it (``read(into)``, as
    ``decode``'s ``into``: a pack's pixels)."""
    x: np.ndarray | None = None
    for row, (data, name) in enumerate(encoded):
        slot = None if x is None else x[row]
        image = data(slot) if callable(data) else reader.decode(data, name, into=slot)
        if x is None:
            x = empty((n, *image.shape))
            x[0] = image
        elif image is not slot:
            if image.shape != x.shape[1:]:  # checked, not broadcast: (1, w, 3) would fill (h, w, 3)
                raise DataError(f"{name}: decoded to {image.shape}, the batch's first image to {x.shape[1:]}")
            x[row] = image
    return x if x is not None else np.empty((0, 0, 0, reader.channels), np.uint8)


def decode_columns(
    reader: ImageReader,
    encoded: Iterable[tuple[bytes | ReadInto, str]],
    labels: np.ndarray,
    allocate: Allocator | None = None,
) -> dict[str, np.ndarray]:
    """``{"x": the images decoded by decode_batch, "y": labels}``, a batch of ``len(labels)``.
    ``allocate`` (the source protocol's, ``sources/base.py``) makes both arrays at once, when
    the first image has given the shape."""
    placed: dict[str, np.ndarray] = {}

    def empty(shape: tuple) -> np.ndarray:
        if allocate is None:
            return np.empty(shape, np.uint8)
        placed.update(allocate({"x": (shape, np.uint8), "y": (labels.shape, labels.dtype)}))
        placed["y"][...] = labels
        return placed["x"]

    x = decode_batch(reader, encoded, len(labels), empty)
    return placed or {"x": x, "y": labels}


def _check_size(size) -> tuple[int, int] | None:
    if size is None:
        return None
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be None or (height, width), got {size!r}") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return h, w


class ImageHeader(NamedTuple):
    """What an image file's header says (``ImageFolder.header``): Pillow's format and mode, size, bands."""

    format: str
    mode: str
    height: int
    width: int
    bands: int


@dataclass
class ImageTree:
    """A tree as ImageFolder sees it (``scan_tree``): the class folders, the image files of each
    (sorted), the class folders that hold none (with the error ImageFolder raises for them) and
    the files it leaves out, with why."""

    classes: list[str]
    images: dict[str, list[str]]
    empty: dict[str, DataError]
    ignored: list[tuple[str, str]]


def scan_tree(root, extensions=IMAGE_EXTENSIONS) -> ImageTree:
    """``root/<class>/**/<image>`` listed by ImageFolder's rules (its class docstring, and
    ``listing.list_tree``, which ImageFolder lists with), so ``steadyfeed inspect`` lists
    exactly what a loader would read."""
    root = os.path.abspath(os.fspath(root))
    extensions = frozenset("." + e.lower().lstrip(".") for e in extensions)
    classes = _class_names(root)
    tree = ImageTree(classes, {}, {}, [])
    with os.scandir(root) as entries:
        tree.ignored += [
            (e.path, "not in a class folder") for e in entries if not e.name.startswith(".") and not e.is_dir()
        ]
    shown = ", ".join(sorted(extensions))
    listing, is_image = list_tree(root, classes), _image_filter(extensions)
    for label, name in enumerate(classes):
        found = range(listing.group_starts[label], listing.group_starts[label + 1])
        tree.images[name] = [listing.path(i) for i in found if is_image(listing.relative_bytes(i))]
        tree.ignored += [
            (listing.path(i), f"not an image file (ImageFolder reads {shown})")
            for i in found
            if not is_image(listing.relative_bytes(i))
        ]
        if not tree.images[name]:
            tree.empty[name] = _no_images(os.path.join(root, name), extensions)
    return tree


def _image_filter(extensions: frozenset):
    """``keep(name bytes)``: whether a file name has one of ``extensions`` (case-insensitive)."""

    def keep(name: bytes) -> bool:
        return os.path.splitext(os.fsdecode(name))[1].lower() in extensions

    return keep


def _no_images(class_dir: str, extensions: frozenset) -> DataError:
    return DataError(
        f"class folder {class_dir} holds no image files; expected files ending in {', '.join(sorted(extensions))}"
    )


def _class_names(root: str) -> list[str]:
    expected = "expected root/<class name>/<image files>"
    if not os.path.exists(root):
        raise FileNotFoundError(f"ImageFolder root {root} does not exist; {expected}")
    if not os.path.isdir(root):
        raise DataError(f"ImageFolder root {root} is not a directory; {expected}")
    with os.scandir(root) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())
    if not names:
        raise DataError(f"ImageFolder root {root} has no class sub-folders; {expected}")
    return names


def _read(path, max_bytes: int) -> bytes:
    # os-level calls, not open(): a batch reads thousands of small files, and the file objects'
    # own work (about 10 us a file) is Python that holds the GIL the decoding threads need
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise DataError(f"{path}: larger than max_bytes={max_bytes:,}; refused without decoding")
            # size + 1: a file that grew since fstat is still caught below; a read sized to the
            # file (not to max_bytes) keeps Python from allocating max_bytes for every image
            data = os.read(fd, size + 1)
            while len(data) < size and (more := os.read(fd, size + 1 - len(data))):  # a short read (FUSE, NFS)
                data += more
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); expected a readable image file") from exc
    if len(data) > max_bytes:
        raise DataError(f"{path}: larger than max_bytes={max_bytes:,}; refused without decoding")
    return data


def _convert(image: Image.Image, mode: str) -> Image.Image:
    """``image`` in ``mode`` ("L", "RGB" or "RGBA"), 8 bits per channel."""
    if image.mode in _WIDE_GRAY:  # Pillow's own convert clips these at 255 (white); keep the high byte
        # (32-bit "I" values beyond 16 bits saturate: Pillow uses "I" for 16-bit data)
        image = Image.fromarray((np.clip(np.asarray(image), 0, 65535) >> 8).astype(np.uint8))
    elif image.mode == "F":
        raise ValueError("32-bit float pixels have no agreed 8-bit scale; expected 8- or 16-bit integer pixels")
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the route Pillow asks for (it warns on P -> RGB with transparency)
    return image.convert(mode)
