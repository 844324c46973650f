"""Byte sizes as people read them, one spelling for every message and table."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """``512 B``, ``1 KiB``, ``1.5 MiB``: binary units, one decimal unless whole."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in _UNITS:
        n /= 1024
        if n < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def exact_bytes(n: int) -> str:
    """``1,536 bytes (1.5 KiB)``: the exact count, and its scale when that helps."""
    return f"{n:,} bytes" if n < 1024 else f"{n:,} bytes ({human_bytes(n)})"
