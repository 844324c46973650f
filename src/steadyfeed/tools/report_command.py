"""``steadyfeed report FINDINGS.json -o report.html [SPEC]``: the HTML page of saved findings.

FINDINGS.json holds the sections of :mod:`steadyfeed.diagnostics` (e.g.
``findings.save(path, monitor.findings() | ...)``, or ``steadyfeed audit --findings``). The
optional SPEC (or a data shortcut, as for every command) names the training data, whose
samples give the thumbnails; ``--against SPEC`` names a second split (``split_b`` of duplicate
pairs). Without data, thumbnails come from the findings' ``file`` paths, where they have them.

    steadyfeed report findings.json -o report.html train.py:make_loader --against train.py:make_val
    steadyfeed report findings.json -o report.html --images photos/
"""

from __future__ import annotations

import contextlib
import sys

from ..diagnostics import findings as findings_io
from ..diagnostics.report import ReportOptions, write
from .spec import LOADER_FLAGS, SpecError, add_spec_arguments, describe, loader_from_args, loader_from_spec, usage_error

HELP = "write one self-contained HTML page of findings: mislabels, image quality, duplicates, quarantine"
INTERMIXED = True  # FINDINGS.json and SPEC on either side of the flags
EXIT_CODES = (
    "exit codes: 0 written; 1 the page could not be written (the error says why; nothing is left at "
    "OUT.html); 2 a usage error (unreadable FINDINGS, bad flags or SPEC)"
)


def add_arguments(parser) -> None:
    parser.add_argument("findings", metavar="FINDINGS.json", help="the findings, as JSON")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.html", help="the page to write")
    add_spec_arguments(
        parser,
        exclude=tuple(LOADER_FLAGS),
        help="the training data, for thumbnails (FILE.py:NAME or MODULE:NAME: a Loader or a source)",
    )
    parser.add_argument("--against", metavar="SPEC", help="a second split's data, for thumbnails of split 'against'")
    add_report_arguments(parser, with_output=False)


def add_report_arguments(parser, with_output: bool = True) -> None:
    """The page's options (shared with ``steadyfeed audit --report``)."""
    group = parser.add_argument_group("report")
    if with_output:
        group.add_argument("--report", metavar="OUT.html", help="also write the findings as one HTML page")
    group.add_argument("--image-key", default="x", metavar="KEY", help="the sample key of the image (default x)")
    group.add_argument("--title", default=None, metavar="TEXT", help="the page's title")
    group.add_argument(
        "--rows",
        type=int,
        default=ReportOptions.rows,
        metavar="N",
        help="entries shown per table (default %(default)s)",
    )


def report_options(args, default_title: str) -> ReportOptions:
    return ReportOptions(title=args.title or default_title, rows=args.rows, image_key=args.image_key)


def run(args) -> int:
    try:
        findings = findings_io.load(args.findings)
        options = report_options(args, f"steadyfeed report: {args.findings}")
        wants_data = args.spec or describe(args)
        loader = loader_from_args(args) if wants_data else None
        against = loader_from_spec(args.against) if getattr(args, "against", None) else None
    except (OSError, SpecError, ValueError) as exc:
        return usage_error("report", exc)
    with contextlib.ExitStack() as stack:
        sources = {}
        for split, opened in (("train", loader), ("against", against)):
            if opened is not None:
                sources[split] = stack.enter_context(opened).source
        try:
            write(args.output, findings, sources=sources, options=options)
        except OSError as exc:
            print(f"steadyfeed report: error: cannot write {args.output}: {exc}", file=sys.stderr)
            return 1
    print(f"steadyfeed report: wrote {args.output}")
    return 0
