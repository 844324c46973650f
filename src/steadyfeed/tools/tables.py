"""Plain-text tables for the commands' human reports."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"^[-+]?[\d,.]+(\s*(\.\.|x|/|%)\s*[\d,.]+)*%?$")  # 12, 1,024, 0.5, 3..7, 24x32, 1 / 4


def table(headers: list[str], rows: list[list[str]], indent: str = "", numbers_right: bool = False) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, the rest right-aligned (or,
    with ``numbers_right``, only the columns whose cells are all numbers or empty)."""
    columns = list(zip(headers, *rows))
    widths = [max(len(cell) for cell in column) for column in columns]
    right = [
        i > 0 and (not numbers_right or all(not c or _NUMBER.match(c) for c in column[1:]))
        for i, column in enumerate(columns)
    ]
    return [
        (indent + "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right))).rstrip()
        for row in [headers, *rows]
    ]
