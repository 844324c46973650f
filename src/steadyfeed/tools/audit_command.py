"""``steadyfeed audit SPEC``: run a loader at several worker settings and check that every epoch
delivered every sample exactly once, with its own label, identically at every setting, and
(with ``--against``) that no sample is shared with another split. See ``tools/audit.py``.

    steadyfeed audit train.py:make_loader --check train.py:label_is_right --against train.py:make_val
    steadyfeed audit --npy-pairs data/in data/labels --batch-size 64 --shuffle --json

Exit code 0 when every check passes, 1 when one fails, 2 for a bad spec or flag: fit for CI.
"""

from __future__ import annotations

import contextlib
import json

from .. import quality
from ..diagnostics import findings as findings_io
from ..diagnostics import image_quality, near_duplicates
from ..diagnostics.report import write as write_report
from .audit import audit, parse_settings
from .report_command import add_report_arguments, report_options
from .spec import (
    SpecError,
    add_spec_arguments,
    describe,
    loader_from_args,
    loader_from_spec,
    resolve_callable,
    usage_error,
)

HELP = "check exactly-once delivery, pairing, reproducibility and split leaks of a loader"
EXIT_CODES = (
    "exit codes: 0 every check passed; 1 a check failed (the report says which); 2 a usage error "
    "(bad flags, a SPEC that does not load, data a source refuses when built)"
)


def add_arguments(parser) -> None:
    add_spec_arguments(parser, exclude=("workers", "mode", "with_ids"))  # the settings choose those; ids always
    audit_options = parser.add_argument_group("audit")
    audit_options.add_argument("--epochs", type=int, default=2, metavar="N", help="epochs per setting (default 2)")
    audit_options.add_argument(
        "--settings",
        default="0,2,2:process",
        metavar="LIST",
        help="comma-separated WORKERS[:MODE] to run and compare (default %(default)s)",
    )
    audit_options.add_argument(
        "--check",
        metavar="FILE.py:FUNC",
        help="check(batch) -> bool, or a bool per row: is each input paired with its label?",
    )
    audit_options.add_argument(
        "--against", metavar="SPEC", help="another split (e.g. validation): report samples whose content both share"
    )
    audit_options.add_argument(
        "--label-key",
        action="append",
        dest="label_keys",
        metavar="KEY",
        help="a label key: compared by id, left out of content digests (default y; repeatable)",
    )
    audit_options.add_argument(
        "--checks",
        default="",
        metavar="NAMES",
        help=f"data-quality checks on the stored samples: {', '.join(quality.CHECKS)} or all; "
        f"image checks {', '.join(image_quality.CHECKS)} or image",
    )
    audit_options.add_argument(
        "--near-duplicates",
        nargs="?",
        type=int,
        const=near_duplicates.MAX_DISTANCE,
        default=None,
        metavar="BITS",
        help="hash every image (pHash) and report near-identical pairs within the split and "
        f"across --against, up to BITS apart (default {near_duplicates.MAX_DISTANCE})",
    )
    audit_options.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="CHECK=VALUE",
        help="an image check's threshold instead of the data's robust one, e.g. blur=0.002 (repeatable)",
    )
    audit_options.add_argument(
        "--drift-threshold",
        type=float,
        default=quality.DRIFT_THRESHOLD,
        metavar="T",
        help="largest total variation between label histograms (default %(default)s)",
    )
    audit_options.add_argument("--json", action="store_true", help="print the report as JSON")
    audit_options.add_argument(
        "--findings",
        metavar="FILE.json",
        help="write the findings (quarantine, quality, ...) as JSON for steadyfeed report",
    )
    add_report_arguments(parser)
    audit_options.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args) -> int:
    try:
        if args.epochs < 1:
            raise SpecError(f"--epochs must be >= 1, got {args.epochs}")
        settings = parse_settings(args.settings)
        checks = quality.check_names(args.checks)
        thresholds = parse_thresholds(args.threshold)
        check = resolve_callable(args.check) if args.check else None
        loader = loader_from_args(args)
        against = loader_from_spec(args.against, args) if args.against else None
    except (SpecError, ValueError) as exc:
        return usage_error("audit", exc)
    with contextlib.ExitStack() as stack:
        for opened in (loader, against):
            if opened is not None:
                stack.enter_context(opened)
        report = audit(
            loader,
            epochs=args.epochs,
            settings=settings,
            check=check,
            against=against,
            label_keys=args.label_keys or ("y",),
            checks=checks,
            drift_threshold=args.drift_threshold,
            thresholds=thresholds,
            near_duplicates=args.near_duplicates,
            target=describe(args),
            progress=args.progress,
        )
        _write_findings(args, report, loader, against)  # while the sources are open, for thumbnails
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.table())
    return 0 if report.passed else 1


def _write_findings(args, report, loader, against) -> None:
    if not (args.findings or args.report):
        return
    found = findings_io.from_audit(report)
    if args.findings:
        findings_io.save(args.findings, found)
    if args.report:
        sources = {"train": loader.source, **({"against": against.source} if against is not None else {})}
        write_report(
            args.report, found, sources=sources, options=report_options(args, f"steadyfeed audit {report.target}")
        )


def parse_thresholds(pairs: list[str]) -> dict[str, float]:
    """``["blur=0.002"]`` -> ``{"blur": 0.002}``, each name an image check."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or name not in image_quality.CHECKS:
            raise ValueError(
                f"--threshold takes CHECK=VALUE with CHECK one of {', '.join(image_quality.CHECKS)}, got {pair!r}"
            )
    return out
