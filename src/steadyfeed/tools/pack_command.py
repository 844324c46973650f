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

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import SteadyfeedError
from ..packing import DEFAULT_SHARD_SIZE, pack
from ..sources.tfrecord import MANIFEST_NAME

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
        data = load(args.spec)
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


def load(spec: str) -> Any:
    """The object SPEC names, called when callable."""
    target, sep, name = spec.rpartition(":")
    if not (sep and target and name):
        raise ValueError(f"SPEC must be FILE.py:NAME or MODULE:NAME, got {spec!r}")
    module = _import_file(target) if target.endswith(".py") else _import_module(target)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{target} has no {name!r}")
        obj = getattr(obj, part)
    return obj() if callable(obj) else obj


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {name!r}: {exc}") from exc


def _import_file(path: str):
    """Import FILE.py as a top-level module, its directory on sys.path, so that spawned
    process workers (which inherit sys.path) can import it by name to unpickle its objects."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SPEC file not found: {path}")
    name = Path(path).stem
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", None) or "") != path:
        raise ValueError(f"cannot import {path} as module {name!r}: a module of that name is already loaded "
                         f"from {getattr(loaded, '__file__', None)}; rename the file")
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    return _import_module(name)
