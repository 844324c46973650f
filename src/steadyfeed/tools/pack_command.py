"""``steadyfeed pack SPEC OUT``: pack a source, or an iterable of sample dicts, into indexed
TFRecord shards that ``TFRecordSource(OUT)`` reads by index and tf.data reads as they are.

SPEC is ``path/to/file.py:NAME`` or ``package.module:NAME``. A callable NAME is called with
no arguments; the result (or NAME itself) must be a source (``len`` + ``getitem``), a Loader
(its source is packed, in id order) or an iterable of sample dicts, e.g. a legacy generator.
The data shortcuts of every command (``--images DIR``, ``--npy-pairs IN LABELS``, ``--hdf5``,
``--csv``, ``--tfrecord``, ...) stand in for SPEC::

    steadyfeed pack make_data.py:samples data/packed --shard-size 5000
    steadyfeed pack --images photos/ data/packed --image-size 224 224 --workers 2 --on-error skip

``--on-error skip`` leaves out samples that fail to read and lists them under "quarantine"
in OUT/manifest.json (``--max-error-fraction`` bounds how many may fail).

``--encoded`` packs an image folder as its files' bytes (``ImageFolder.encoded()``, what
``Loader(pack_to=...)`` stores): record i is ``{"x": the bytes of file i, "y": its label}``,
a pack the size of the files rather than of their pixels (5-10x smaller for JPEGs), which
tf.data reads with ``tf.io.parse_single_example`` and ``tf.io.decode_image`` (the label is
its int64's raw bytes, as pack stores every array: ``tf.io.decode_raw``), and steadyfeed
with ``TFRecordSource(OUT)`` and ``decode_image`` in a transform::

    steadyfeed pack --images photos/ data/packed --encoded

``--decoded SHARE`` (with ``--encoded``) also holds that share of the images decoded beside
the shards (``ImageFolder.encoded(decoded=SHARE)``, what ``Loader(pack_decoded=...)``
keeps), made with ``--image-size`` and ``--channels``; ``ImageFolder(...).from_encoded(
TFRecordSource(OUT))`` reads them straight into its batches, and refuses a folder whose
decoding settings differ::

    steadyfeed pack --images photos/ data/packed --encoded --decoded 1 --image-size 128 128
"""

from __future__ import annotations

import json
import sys
import time

from ..config import FailureOptions
from ..errors import SteadyfeedError
from ..loader import Loader
from ..packing import DEFAULT_SHARD_SIZE, pack
from ..sources.tfrecord import MANIFEST_NAME
from .spec import LOADER_FLAGS, SpecError, add_spec_arguments, data_from_args, describe, loader_options, usage_error

HELP = "pack any source (or an iterable of sample dicts) into indexed TFRecord shards"
EXIT_CODES = (
    "exit codes: 0 packed (samples skipped under --on-error skip are listed in the manifest); "
    "1 the data failed (a sample unreadable under --on-error raise, too many failures, a sample "
    "unlike the first, a write error; nothing is left at OUT); 2 a usage error (bad flags or SPEC, "
    "OUT not empty)"
)
PACK_FLAGS = ("workers", "mode", "on_error", "max_error_fraction")  # the loader options pack uses


def add_arguments(parser) -> None:
    add_spec_arguments(
        parser,
        exclude=tuple(name for name in LOADER_FLAGS if name not in PACK_FLAGS),
        help="FILE.py:NAME or MODULE:NAME: a function returning a source, a steadyfeed.Loader "
        "(its source is packed) or an iterable of sample dicts",
    )
    parser.add_argument("out", metavar="OUT", help="output directory (must not exist, or be empty)")
    parser.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_SIZE,
        metavar="N",
        help="records per shard (default %(default)s)",
    )
    parser.add_argument(
        "--encoded",
        action="store_true",
        help="--images: store each image file's bytes as they are, not its decoded pixels "
        "(decoded when read back; --image-size and --channels apply then, not here)",
    )
    parser.add_argument(
        "--decoded",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="with --encoded: also hold this share of the images (0 to 1) decoded beside the shards, "
        "with --image-size and --channels, for reading back without decoding",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")


def _encoded(source, args):
    """``source`` in its encoded form (``--encoded``): what a source with ``encoded()`` packs as."""
    encoded = getattr(source, "encoded", None)
    if encoded is None:
        raise SpecError(f"--encoded packs an image folder as its files' bytes; {describe(args)} has no encoded form")
    if not args.decoded and (args.image_size is not None or args.channels != 3):
        raise SpecError(
            "--encoded stores the files as they are; --image-size and --channels apply when they are "
            "decoded (steadyfeed.decode_image(x, size=..., channels=...)), so leave them out here, or "
            "give --decoded SHARE to hold images decoded with them"
        )
    return encoded(args.decoded) if args.decoded else encoded()


def _options(data, args) -> dict:
    """workers, mode, on_error, max_error_fraction: the flags given, else the Loader's, else the defaults."""
    config = data.config if isinstance(data, Loader) else None
    base = {
        "workers": 0,
        "mode": "thread",
        "on_error": "raise",
        "max_error_fraction": FailureOptions().max_error_fraction,
    }
    if config is not None:
        base = {name: value for name, value in config.options().items() if name in PACK_FLAGS}
    options = {**base, **loader_options(args)}
    if args.shard_size < 1:
        raise SpecError(f"--shard-size must be >= 1, got {args.shard_size}")
    FailureOptions(on_error=options["on_error"], max_error_fraction=options["max_error_fraction"])  # ValueError
    if options["workers"] and not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise SpecError(f"{describe(args)} is an iterable, read once in order: --workers needs a source")
    return options


def run(args) -> int:
    try:
        data = data_from_args(args)
        options = _options(data, args)
        source = data.source if isinstance(data, Loader) else data
        if args.encoded:
            source = _encoded(source, args)
        elif args.decoded:
            raise SpecError("--decoded SHARE holds images decoded beside a pack of their bytes: give --encoded too")
    except (SpecError, ValueError) as exc:
        return usage_error("pack", exc)
    start = time.perf_counter()
    try:
        out = pack(source, args.out, args.shard_size, progress=args.progress, **options)
    except FileExistsError as exc:  # OUT names a directory that holds something: an argument to fix
        return usage_error("pack", exc)
    except (SteadyfeedError, OSError, ValueError) as exc:  # DataError is a ValueError
        print(f"steadyfeed pack: error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    with open(out / MANIFEST_NAME, encoding="utf-8") as f:
        manifest = json.load(f)
    samples, skipped = manifest["samples"], manifest["quarantine"]
    print(
        f"packed {samples} samples into {len(manifest['shards'])} shard(s) in {out} "
        f"in {seconds:.1f} s ({samples / max(seconds, 1e-9):,.0f} samples/s)"
    )
    if skipped:
        first = skipped[0]
        where = f" ({first['location']})" if first["location"] else ""
        print(
            f'skipped {len(skipped)} sample(s) that failed to read, listed under "quarantine" in '
            f"{out / MANIFEST_NAME}; first: sample {first['sample_id']}{where}: {first['error_type']}: "
            f"{first['message']}"
        )
    return 0
