"""Isolation: which ids a report says to leave out, and why, as a loader's ``exclude=`` reads them.

:func:`read_exclusions` turns what ``Loader(..., exclude=...)`` was given into an
:class:`~steadyfeed.sampling.exclusion.Exclusions` record (every id excluded from epoch 0):

* ids (any iterable of ints), or ``{id: reason}``;
* a file: a JSON list of ids, a findings dict (the sections of ``diagnostics/__init__.py``),
  an audit report (``steadyfeed audit --json``: its ``"findings"``), or JSON lines as a
  quarantine file holds them (``{"sample_id", "error_type", ...}`` per line).

From findings, the ids excluded are (the reason says which rule): every id flagged by a
``"quality"`` check; of a ``"duplicates"`` pair within one split its second sample ``b`` (one
copy stays), of a pair across splits its sample ``a`` (the copy in the audited split, which
leaks into the other); every ``"label_noise"`` suspect; every ``"quarantine"`` entry; every
``"excluded"`` entry, with its reason. Reading is deterministic: the same file gives the same
record, so every shard and every run excludes the same ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from ..sampling.exclusion import Exclusions

GIVEN = "exclude option"  # the reason of ids given as plain ids


def read_exclusions(spec: Any, reason: str = GIVEN) -> Exclusions:
    """The record ``spec`` (ids, ``{id: reason}``, or a file, see the module docstring) describes."""
    if spec is None:
        return Exclusions.none()
    if isinstance(spec, (str, os.PathLike)):
        return _record(_from_json(_load(os.fspath(spec)), reason))
    if isinstance(spec, Mapping) and not _is_findings(spec):
        return _record((int(i), str(why)) for i, why in spec.items())
    if isinstance(spec, Mapping):
        return _record(from_findings(spec))
    return _record((i, reason) for i in _ints(spec))


def from_findings(findings: Mapping) -> Iterator[tuple[int, str]]:
    """``(id, reason)`` for every id a findings dict (or an audit report) says to leave out."""
    findings = findings.get("findings", findings)
    for name, check in (findings.get("quality") or {}).get("checks", {}).items():
        for flagged in check.get("flagged", ()):
            yield int(flagged["id"]), f"quality:{name}"
    for pair in findings.get("duplicates") or ():
        across = pair.get("split_b") is not None and pair.get("split_b") != pair.get("split_a")
        if across:
            yield int(pair["a"]), f"near-duplicate of {pair['split_b']} sample {pair['b']}"
        else:
            yield int(pair["b"]), f"near-duplicate of sample {pair['a']}"
    for suspect in (findings.get("label_noise") or {}).get("suspects", ()):
        yield int(suspect["id"]), "label_noise"
    for entry in findings.get("quarantine") or ():
        yield int(entry.get("id", entry.get("sample_id"))), f"quarantine: {entry.get('error', entry.get('error_type'))}"
    for entry in findings.get("excluded") or ():
        yield int(entry["id"]), str(entry.get("reason", GIVEN))


_SECTIONS = ("findings", "quality", "duplicates", "label_noise", "quarantine", "excluded")


def _is_findings(obj: Mapping) -> bool:
    return any(isinstance(k, str) and k in _SECTIONS for k in obj)


def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:  # a quarantine file: one JSON object a line
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"exclude={path!r}: neither JSON nor JSON lines ({exc})") from None


def _from_json(obj: Any, reason: str) -> Iterator[tuple[int, str]]:
    if isinstance(obj, Mapping):
        if not _is_findings(obj):
            raise ValueError(f"an exclude file's object must hold findings sections ({', '.join(_SECTIONS)})")
        yield from from_findings(obj)
        return
    for item in obj:
        if isinstance(item, Mapping) and "sample_id" in item:  # a quarantine line
            yield int(item["sample_id"]), f"quarantine: {item.get('error_type', 'error')}"
        elif isinstance(item, Mapping):
            yield int(item["id"]), str(item.get("reason", reason))
        else:
            yield int(item), reason


def _ints(ids: Iterable) -> list[int]:
    a = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids).reshape(-1)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"exclude= takes integer sample ids, got {a.dtype} values")
    return a.astype(np.int64).tolist()


def _record(pairs: Iterable[tuple[int, str]]) -> Exclusions:
    """The record of ``(id, reason)`` pairs, all from epoch 0; an id named twice keeps its first reason."""
    first: dict[int, str] = {}
    for i, why in pairs:
        first.setdefault(int(i), why)
    ids = np.array(sorted(first), dtype=np.int64)
    return Exclusions(ids, np.zeros(len(ids), np.int64), tuple(first[i] for i in ids.tolist()))
