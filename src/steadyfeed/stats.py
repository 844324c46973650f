"""LoaderStats: what the loader measures about itself as it runs.

Cheap enough to leave on (a few additions per batch, a bounded timeline), so the
figures behind ``steadyfeed bench`` and the Keras monitor come from the real loader,
not from a separately instrumented copy.

Stage times are summed over workers (``read``, ``transform``, ``collate`` in the
workers; ``transport``, taking a batch out of shared memory (mapping it, or copying it
when it is not lent), in the consumer's
process: in its own thread), so
with N workers they can add up to N times the wall time. ``wait_seconds`` is the
consumer's time blocked waiting for the next batch: the training loop's idle time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

TIMELINE_POINTS = 10_000  # the queue-fill timeline keeps the most recent points only
STAGES = ("read", "transform", "collate", "transport")


@dataclass
class LoaderStats:
    batches: int = 0
    samples: int = 0
    skipped: int = 0
    wait_seconds: float = 0.0
    inline_batches: int = 0  # made by the consumer itself (all of them with workers=0)
    first_batch_seconds: float | None = None  # latency of the most recent epoch's first batch
    stage_seconds: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    fill_total: int = 0  # sum over taken batches of how many batches were ready at that moment
    fill_max: int = 0
    fill_timeline: deque = field(default_factory=lambda: deque(maxlen=TIMELINE_POINTS))
    started: float = field(default_factory=time.monotonic)
    # how batches reach the consumer: "in-process" (workers=0, threads), "shm" or "pipe" (process
    # workers), "ray"; and, once process workers fell back from shared memory to pipes, why
    transport: str = "in-process"
    transport_fallback: str | None = None
    # process workers' batches handed over as views of their shared-memory slots, not copied
    # (``execution/shm.py``); and, once a slot to lend from found no room, why lending stopped
    lent_batches: int = 0
    lending_stopped: str | None = None
    components: dict = field(default_factory=dict)  # a Mixture's component name -> {"samples", "skipped"}
    reading: str = "files"  # what the current or last epoch read: "files" (the source) or "pack" (pack_to)
    pack_batches: int = 0  # batches read from the pack (pack_to)

    def record_fill(self, ready: int) -> None:
        """Called as each batch is taken: the queue watermark at that moment."""
        self.fill_total += ready
        self.fill_max = max(self.fill_max, ready)
        self.fill_timeline.append((time.monotonic() - self.started, ready))

    def count_components(self, source, delivered, skipped) -> None:
        """Per component of a source that has them (``Mixture.components_of``): samples delivered and skipped."""
        components_of = getattr(source, "components_of", None)
        if components_of is None:
            return
        names = source.component_names
        for key, ids in (("samples", delivered), ("skipped", skipped)):
            if len(ids):
                for component, count in zip(*np.unique(components_of(ids), return_counts=True)):
                    entry = self.components.setdefault(names[component], {"samples": 0, "skipped": 0})
                    entry[key] += int(count)

    def add_stages(self, timings: dict) -> None:
        for stage, seconds in timings.items():
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "samples": self.samples,
            "skipped": self.skipped,
            "wait_seconds": self.wait_seconds,
            "inline_batches": self.inline_batches,
            "first_batch_seconds": self.first_batch_seconds,
            "stage_seconds": dict(self.stage_seconds),
            "queue_fill_mean": self.fill_total / self.batches if self.batches else 0.0,
            "queue_fill_total": self.fill_total,
            "queue_fill_max": self.fill_max,
            "queue_fill_timeline": list(self.fill_timeline),
            "transport": self.transport,
            "transport_fallback": self.transport_fallback,
            "lent_batches": self.lent_batches,
            "lending_stopped": self.lending_stopped,
            "reading": self.reading,
            "pack_batches": self.pack_batches,
            **({"components": {name: dict(c) for name, c in self.components.items()}} if self.components else {}),
        }


COUNTERS = (
    "batches",
    "samples",
    "skipped",
    "wait_seconds",
    "inline_batches",
    "queue_fill_total",
    "pack_batches",
    "lent_batches",
)


def stats_delta(before: dict, after: dict) -> dict:
    """What happened between two ``loader.stats()`` snapshots: every counter's difference,
    each stage's seconds, and the mean queue fill over the batches in between."""
    delta = {key: after[key] - before[key] for key in COUNTERS}
    delta["stage_seconds"] = {
        stage: seconds - before["stage_seconds"].get(stage, 0.0) for stage, seconds in after["stage_seconds"].items()
    }
    delta["queue_fill_mean"] = delta["queue_fill_total"] / delta["batches"] if delta["batches"] else 0.0
    return delta
