"""``steadyfeed pack SPEC OUT``: pack a source, or an iterable of sample dicts, into indexed
TFRecord shards that ``TFRecordSource(OUT)`` reads by index and tf.data reads as they are.

SPEC is ``path/to/file.py:NAME`` or ``package.module:NAME``. A callable NAME is called with
no arguments; the result (or NAME itself) must be a source (``len`` + ``getitem``) or an
iterable of sample dicts, e.g. a legacy generator::

    steadyfeed pack make_data.py:samples data/packed --shard-size 5000

Exit code 0 when packed; 1 with a one-line message on stderr when the data or the
arguments are wrong (nothing is left at OUT then).
"""
from __future__ import annotations

import json
import sys
import time

from ..errors import SteadyfeedError
from ..packing import DEFAULT_SHARD_SIZE, pack
from ..sources.tfrecord import MANIFEST_NAME
from .spec import resolve

HELP = "pack any source (or an iterable of sample dicts) into indexed TFRecord shards"


def add_arguments(parser) -> None:
    parser.add_argument("spec", metavar="SPEC",
                        help="FILE.py:NAME or MODULE:NAME, a function returning a source or an iterable "
                             "of sample dicts")
    parser.add_argument("out", metavar="OUT", help="output directory (must not exist, or be empty)")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, metavar="N",
                        help="records per shard (default %(default)s)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="read and encode a source with N workers (default 0: in this thread)")
    parser.add_argument("--mode", choices=("thread", "process"), default="thread", help="worker kind (default thread)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")


def run(args) -> int:
    try:
        data = resolve(args.spec)
        start = time.perf_counter()
        out = pack(data, args.out, args.shard_size, workers=args.workers, mode=args.mode, progress=args.progress)
    except (SteadyfeedError, OSError, ValueError) as exc:  # DataError is a ValueError
        print(f"steadyfeed pack: error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    with open(out / MANIFEST_NAME, encoding="utf-8") as f:
        manifest = json.load(f)
    samples = manifest["samples"]
    print(f"packed {samples} samples into {len(manifest['shards'])} shard(s) in {out} "
          f"in {seconds:.1f} s ({samples / max(seconds, 1e-9):,.0f} samples/s)")
    return 0
