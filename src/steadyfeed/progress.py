"""Progress bars for long work (pack, the commands): tqdm on stderr, or a silent stand-in.

stdout stays clean for reports and ``--json``; a missing tqdm (the ``cli`` extra) costs
the bar, never the command.
"""

from __future__ import annotations

import sys


class _Silent:
    """Stands in for a tqdm bar: every method accepts anything and does nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc) -> None:
        return None


def progress_bar(total: int | None, desc: str, *, unit: str = "it", enabled: bool = True, leave: bool = False):
    """A tqdm bar on stderr when ``enabled`` and tqdm is installed, else a silent stand-in.
    Use it as a context manager; ``update(n)`` advances it."""
    if not enabled:
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=leave)
