"""``steadyfeed inspect DATA``: what data holds, before training; nothing is modified.
See ``tools/inspection.py`` for what is reported.

    steadyfeed inspect data/images --workers 4          # a directory (or one file)
    steadyfeed inspect train.py:make_source --checks all # any loader or source, read as stored
    steadyfeed inspect --hdf5 d.h5 --key x=/images --key y=/labels --json

Exit code 0 when everything was readable (and passed ``--checks``), 1 otherwise, 2 for a
bad argument.
"""
from __future__ import annotations

import json
import os

from .. import quality
from .inspection import inspect_files, inspect_loader
from .spec import SpecError, add_spec_arguments, describe, loader_from_args, usage_error

HELP = "explore data before training: counts, sizes, shapes, image modes, labels, unreadable files"
EXIT_CODES = ("exit codes: 0 everything a loader reads is readable and would be accepted (and passed "
              "--checks); 1 something is unreadable, would be refused, or failed a check (listed with why); "
              "2 a usage error (bad flags, a SPEC that does not load, no such file)")


def add_arguments(parser) -> None:
    add_spec_arguments(parser, metavar="DATA", exclude=("with_ids",),
                       help="a directory or file, or FILE.py:NAME / MODULE:NAME naming a loader or source; "
                            "--workers also sets the threads that read files")
    options = parser.add_argument_group("inspect")
    options.add_argument("--decode", action="store_true",
                         help="decode every image and read every .npy file in full (finds truncated files)")
    options.add_argument("--checks", default="", metavar="NAMES",
                         help=f"data-quality checks ({', '.join(quality.CHECKS)} or all); implies --decode")
    options.add_argument("--label-key", action="append", dest="label_keys", metavar="KEY",
                         help="a loader's label key for the label histogram (default y; repeatable)")
    options.add_argument("--json", action="store_true", help="print the report as JSON")
    options.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args) -> int:
    try:
        checks = quality.check_names(args.checks)
        is_path = args.spec is not None and os.path.exists(args.spec)
        if args.spec is not None and not is_path and ":" not in args.spec:
            raise SpecError(f"{args.spec}: no such file or directory (DATA is a directory, a file, "
                            "or FILE.py:NAME / MODULE:NAME)")
        loader = None if is_path else loader_from_args(args)
    except (SpecError, ValueError) as exc:
        return usage_error("inspect", exc)
    if loader is None:
        report = inspect_files(args.spec, decode=args.decode, checks=checks, workers=args.workers or 0,
                               progress=args.progress)
    else:
        with loader:
            report = inspect_loader(loader, label_keys=args.label_keys or ("y",), checks=checks,
                                    target=describe(args), progress=args.progress)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.text())
    return 0 if report.passed else 1
