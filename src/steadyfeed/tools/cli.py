"""The ``steadyfeed`` command line.

Each command is a module in ``steadyfeed.tools`` with a one-line ``HELP``, ``EXIT_CODES``
(what its exit codes mean, shown by ``--help``), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code: 0 all good, 1 a failed check, 2 a usage error, for
every command). Commands are
imported only when chosen, so ``steadyfeed --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command name -> module in steadyfeed.tools
COMMANDS = {
    "demo": "demo",
    "pack": "pack_command",
    "bench": "bench_command",
    "audit": "audit_command",
    "inspect": "inspect_command",
    "report": "report_command",
}

HELPS = {
    "demo": "generate a dataset, feed it through every mode, check every promise",
    "pack": "pack any source into indexed TFRecord shards (random access, exactly once)",
    "bench": "measure a loader over workers x mode, name the bottleneck, recommend a setting",
    "audit": "check a loader: exactly once, paired, reproducible, no split leaks (exit 1 on failure)",
    "inspect": "explore data before training: counts, sizes, shapes, modes, labels, unreadable files",
    "report": "one HTML page of findings: suspected mislabels, image quality, duplicates, quarantine",
}


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="steadyfeed", description="Feed larger-than-memory data, correctly.")
    parser.add_argument("--version", action="version", version=f"steadyfeed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in HELPS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        _parser().parse_args(argv)  # prints usage / help, exits
        return 2
    module = importlib.import_module(f"steadyfeed.tools.{COMMANDS[argv[0]]}")
    parser = argparse.ArgumentParser(prog=f"steadyfeed {argv[0]}", description=module.HELP, epilog=module.EXIT_CODES)
    module.add_arguments(parser)
    # a command of two positionals (report FINDINGS [SPEC]) takes them on either side of its flags
    parse = parser.parse_intermixed_args if getattr(module, "INTERMIXED", False) else parser.parse_args
    return int(module.run(parse(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
