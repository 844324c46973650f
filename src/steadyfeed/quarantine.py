"""The record of samples skipped under ``on_error="skip"``.

Each entry names the sample id, where it lives, the epoch, the batch, the attempts
and the error. Entries are kept in memory (``Loader.quarantine_report()``) and, when
a path is given, appended to it as JSON lines as they happen, so a crash later in
the run still leaves the report on disk.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class QuarantineEntry:
    sample_id: int
    epoch: int
    batch_index: int
    attempts: int
    error_type: str
    message: str
    location: str | None


class Quarantine:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        self.entries: list[QuarantineEntry] = []
        self._per_epoch: Counter = Counter()

    def add(self, entry: QuarantineEntry) -> None:
        self.entries.append(entry)
        self._per_epoch[entry.epoch] += 1
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(entry)) + "\n")

    def count(self, epoch: int) -> int:
        return self._per_epoch[epoch]

    def report(self) -> list[dict]:
        return [asdict(e) for e in self.entries]
