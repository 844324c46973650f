"""LoaderConfig: every knob of a Loader, validated in one place."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from .sampling.plan import LAST_BATCH_POLICIES

MODES = ("thread", "process", "ray")
ERROR_POLICIES = ("raise", "skip")


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    transform: Callable | None = None
    workers: int = 0
    mode: str = "thread"
    prefetch: int | None = None
    last_batch: str = "partial"
    shard_index: int = 0
    shard_count: int = 1
    on_error: str = "raise"
    retries: int = 0
    timeout: float | None = None
    quarantine: str | os.PathLike | None = None
    with_ids: bool = False
    sampler: Any = None
    max_error_fraction: float = 0.1
    inline_when_faster: bool | None = None
    worker_niceness: int = 5

    def __post_init__(self):
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(isinstance(self.batch_size, int) and self.batch_size >= 1, f"batch_size must be an int >= 1, got {self.batch_size!r}")
        need(int(self.seed) >= 0, f"seed must be >= 0, got {self.seed}")
        need(self.workers >= 0, f"workers must be >= 0, got {self.workers}")
        need(self.mode in MODES, f"mode must be one of {MODES}, got {self.mode!r}")
        need(self.prefetch is None or self.prefetch >= 1, f"prefetch must be >= 1, got {self.prefetch}")
        need(self.last_batch in LAST_BATCH_POLICIES, f"last_batch must be one of {LAST_BATCH_POLICIES}, got {self.last_batch!r}")
        need(self.shard_count >= 1 and 0 <= self.shard_index < self.shard_count,
             f"need 0 <= shard_index < shard_count, got shard_index={self.shard_index}, shard_count={self.shard_count}")
        need(self.on_error in ERROR_POLICIES, f"on_error must be one of {ERROR_POLICIES}, got {self.on_error!r}")
        need(self.retries >= 0, f"retries must be >= 0, got {self.retries}")
        need(self.timeout is None or self.timeout > 0, f"timeout must be > 0 seconds, got {self.timeout}")
        need(self.timeout is None or self.workers > 0,
             "timeout needs workers >= 1: a sample running in the consumer's own thread cannot be interrupted")
        need(0.0 <= self.max_error_fraction <= 1.0, f"max_error_fraction must be in [0, 1], got {self.max_error_fraction}")
        need(self.inline_when_faster in (None, True, False),
             f"inline_when_faster must be None, True or False, got {self.inline_when_faster!r}")
        need(not (self.inline_when_faster and self.timeout is not None),
             "inline_when_faster=True cannot go with a timeout: a batch made in the consumer cannot be interrupted")
        need(not (self.inline_when_faster and self.mode == "ray"),
             "inline_when_faster is for thread and process mode, not Ray")
        need(isinstance(self.worker_niceness, int) and 0 <= self.worker_niceness <= 19,
             f"worker_niceness must be an int from 0 (the consumer's priority) to 19, got {self.worker_niceness!r}")
        need(not (self.shuffle and self.sampler is not None), "pass either shuffle=True or a sampler, not both")
        need(self.transform is None or callable(self.transform), "transform must be callable(sample, rng) -> dict")

    @property
    def makes_batches_inline(self) -> bool:
        """With workers: whether the consumer may make a batch itself when that measures faster
        than handing it to a worker (``execution/handoff.py``). Unset: yes, in thread and process
        mode without a timeout (a batch made in the consumer cannot be interrupted)."""
        if self.inline_when_faster is None:
            return self.mode != "ray" and self.timeout is None
        return self.inline_when_faster

    @property
    def effective_prefetch(self) -> int:
        if self.prefetch is not None:
            return self.prefetch
        return max(2 * self.workers, 1)
