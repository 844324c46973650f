"""``steadyfeed inspect DATA``: what data holds, before training; nothing is modified.
See ``tools/inspection.py`` for what is reported.

    steadyfeed inspect data/images --workers 4          # a directory (or one file)
    steadyfeed inspect data/images --image-size 224 224 # what ImageFolder(size=...) would read
    steadyfeed inspect train.py:make_source --checks all # any loader or source, read as stored
    steadyfeed inspect --hdf5 d.h5 --key x=/images --key y=/labels --json
    steadyfeed inspect --tfrecord 'train-*'             # TFRecord files: their features, and how to read them

It reads with the sources' own readers and judges with the loader's own rules, so it never
passes what a loader would refuse (with the ``--collate``, ``--image-size`` and
``--channels`` given); each finding says why.
"""

from __future__ import annotations

import glob
import json
import os

from .. import quality
from ..config import AUTO
from ..diagnostics import image_quality
from ..errors import DataError
from ..execution.auto import usable_cores
from .audit_command import parse_thresholds
from .inspection import InspectReport, inspect_files, inspect_loader
from .spec import SpecError, add_spec_arguments, describe, loader_from_args, usage_error

HELP = "explore data before training: counts, sizes, shapes, image modes, labels, what a loader would refuse"
EXIT_CODES = (
    "exit codes: 0 everything a loader reads is readable and would be accepted (and passed "
    "--checks); 1 something is unreadable, would be refused, or failed a check (listed with why); "
    "2 a usage error (bad flags, a SPEC that does not load, no such file)"
)


def add_arguments(parser) -> None:
    add_spec_arguments(
        parser,
        metavar="DATA",
        exclude=("with_ids",),
        help="a directory or file, or FILE.py:NAME / MODULE:NAME naming a loader or source; "
        "--workers also sets the threads that read files",
    )
    options = parser.add_argument_group("inspect")
    options.add_argument(
        "--decode",
        action="store_true",
        help="decode every image and read every .npy file in full (finds truncated files)",
    )
    options.add_argument(
        "--checks",
        default="",
        metavar="NAMES",
        help=f"data-quality checks ({', '.join(quality.CHECKS)} or all; image checks "
        f"{', '.join(image_quality.CHECKS)} or image, judged by the data's robust "
        "outliers); implies --decode",
    )
    options.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="CHECK=VALUE",
        help="an image check's threshold instead of the data's robust one (repeatable)",
    )
    options.add_argument(
        "--label-key",
        action="append",
        dest="label_keys",
        metavar="KEY",
        help="a loader's label key for the label histogram (default y; repeatable)",
    )
    options.add_argument("--json", action="store_true", help="print the report as JSON")
    options.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _files_report(args, checks) -> InspectReport:
    """DATA as files, or the files of ``--tfrecord GLOB`` when no --feature says how to read them."""
    settings = dict(
        decode=args.decode,
        checks=checks,
        workers=usable_cores() if args.workers == AUTO else args.workers or 0,  # threads reading files
        progress=args.progress,
        collate=args.collate or "stack",
        size=args.image_size,
        channels=args.channels,
        thresholds=parse_thresholds(args.threshold),
    )
    if args.spec is not None:
        return inspect_files(args.spec, **settings)
    files = sorted(glob.glob(os.path.expanduser(args.tfrecord)))
    report = inspect_files(
        os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0]) or ".", files=files, **settings
    )
    report.target = describe(args)
    return report


def _wants_files(args) -> bool:
    if args.spec is not None:
        return os.path.exists(args.spec)
    pattern = os.path.expanduser(args.tfrecord or "")
    return bool(args.tfrecord and not args.feature and not os.path.isdir(pattern) and glob.glob(pattern))


def _refused_at_construction(args, exc: SpecError) -> InspectReport | None:
    """A shortcut's source refusing the data when built (an empty class folder, unpaired files)
    is a finding, not a usage error."""
    if not isinstance(exc.__cause__, DataError):
        return None
    report = InspectReport(describe(args), "samples", 0, collate=args.collate or "stack")
    report.refused.append({"item": describe(args), "reason": str(exc.__cause__)})
    return report


def run(args) -> int:
    report = None
    try:
        checks = quality.check_names(args.checks)
        parse_thresholds(args.threshold)  # a bad one is a usage error, before anything is read
        if args.spec is not None and not os.path.exists(args.spec) and ":" not in args.spec:
            raise SpecError(
                f"{args.spec}: no such file or directory (DATA is a directory, a file, or FILE.py:NAME / MODULE:NAME)"
            )
        loader = None if _wants_files(args) else loader_from_args(args)
    except SpecError as exc:
        report = _refused_at_construction(args, exc)
        if report is None:
            return usage_error("inspect", exc)
        loader = None
    except ValueError as exc:
        return usage_error("inspect", exc)
    if report is None and loader is None:
        report = _files_report(args, checks)
    elif report is None:
        assert loader is not None  # no report yet: the loader was made
        with loader:
            report = inspect_loader(
                loader,
                label_keys=args.label_keys or ("y",),
                checks=checks,
                target=describe(args),
                progress=args.progress,
                thresholds=parse_thresholds(args.threshold),
            )
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.text())
    return 0 if report.passed else 1
