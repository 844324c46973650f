"""Findings: the JSON-able sections a report renders (their shape is in ``steadyfeed.diagnostics``).

``merge`` puts sections from several diagnostics into one findings dict, ``save`` / ``load``
write and read them as JSON (atomically; nothing but JSON is ever read), and the ``from_*``
functions turn what other parts of steadyfeed report into sections: a loader's quarantine and
an audit's findings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ..files import atomic_write

SECTIONS = ("label_noise", "quality", "duplicates", "quarantine", "excluded")
_LISTS = ("duplicates", "quarantine", "excluded")  # sections that are lists of entries: merged by concatenation


def merge(*parts: dict) -> dict:
    """One findings dict from several: list sections are concatenated (in order, each entry once),
    the others are taken from the last part that has them; keys outside the sections are kept."""
    merged: dict = {}
    for part in parts:
        for key, value in (part or {}).items():
            if key in _LISTS:
                seen = merged.setdefault(key, [])
                seen.extend(entry for entry in value if entry not in seen)
            elif key == "quality" and key in merged:
                merged[key] = {
                    **merged[key],
                    "checks": {**merged[key].get("checks", {}), **value.get("checks", {})},
                    "per_class": {**merged[key].get("per_class", {}), **value.get("per_class", {})},
                }
            else:
                merged[key] = value
    return merged


def save(path: str | os.PathLike, findings: dict) -> None:
    """Write ``findings`` as JSON to ``path``; a reader never sees a partial file."""
    atomic_write(path, json.dumps(findings, indent=1, default=_plain).encode())


def load(path: str | os.PathLike) -> dict:
    """Read findings written by ``save`` (or any JSON object of the sections)."""
    with open(path, encoding="utf-8") as f:
        findings = json.load(f)
    if not isinstance(findings, dict):
        raise ValueError(
            f"{os.fspath(path)}: findings are a JSON object of sections {SECTIONS}, got a {type(findings).__name__}"
        )
    return findings


def from_quarantine(entries: Iterable[dict]) -> dict:
    """The ``quarantine`` section from ``Loader.quarantine_report()`` entries (or audit's)."""
    return {
        "quarantine": [
            {
                "id": int(e["sample_id"]),
                "file": e.get("location"),
                "epoch": e.get("epoch"),
                "attempt": e.get("attempts"),
                "error": f"{e.get('error_type', 'Error')}: {_first_line(e.get('message'))}",
            }
            for e in entries
        ]
    }


def from_audit(report: Any) -> dict:
    """Sections from an :class:`~steadyfeed.tools.audit.AuditReport`: the samples that failed to
    read (``quarantine``), the samples failing ``quality:<name>`` checks (``quality``), and the
    report's own ``findings`` (image quality, near-duplicates, excluded ids)."""
    parts = []
    for check in report.checks:
        details = check.details or {}
        if check.name == "readable":
            parts.append(from_quarantine(details.get("failed", [])))
        elif check.name.startswith("quality:") and details.get("problems"):
            flagged = [
                {"id": p["sample_id"], "score": None, "reason": f"{p['key']}: {p['detail']}"}
                for p in details["problems"]
            ]
            parts.append(
                {"quality": {"checks": {check.name.partition(":")[2]: {"threshold": None, "flagged": flagged}}}}
            )
    parts.append(getattr(report, "findings", None) or {})  # the sections the audit made (quality, duplicates, ...)
    return merge(*parts)


def _first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-able")
