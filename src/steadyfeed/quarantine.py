"""The record of samples skipped under ``on_error="skip"``.

Each entry names the sample id, where it lives, the epoch, the batch, the attempts
and the error. Entries are kept in memory (``Loader.quarantine_report()``) and, when
a path is given, appended to it as JSON lines as they happen, so a crash later in
the run still leaves the report on disk.

Each line is appended whole or not at all (``files.append_whole``): the file never ends in
half a line. When it cannot be written (a full disk, a read-only directory), one
``RuntimeWarning`` names the file and why (for a full disk, the bytes needed); the file then
stays as it was, a prefix of the report (no gaps), and training goes on: the report in
memory keeps every entry.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from dataclasses import asdict, dataclass

from .files import append_whole


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
        self.unwritten: str | None = None  # why the file stopped, once it did

    def add(self, entry: QuarantineEntry) -> None:
        self.entries.append(entry)
        self._per_epoch[entry.epoch] += 1
        if self.path is not None and self.unwritten is None:
            try:
                append_whole(self.path, (json.dumps(asdict(entry)) + "\n").encode("utf-8"))
            except OSError as exc:
                self.unwritten = str(exc)
                warnings.warn(
                    f"the quarantine file {self.path} cannot take entry {len(self.entries)} ({exc}); it "
                    f"keeps the {len(self.entries) - 1} entries before, and loader.quarantine_report() "
                    "every one",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def count(self, epoch: int) -> int:
        return self._per_epoch[epoch]

    def report(self) -> list[dict]:
        return [asdict(e) for e in self.entries]
