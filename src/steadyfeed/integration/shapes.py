"""What a loader's batches look like, learned without side effects (framework-free)."""

from __future__ import annotations

from typing import Any

from ..errors import SampleError
from ..execution.batch import SHAPE_SUFFIX


def peek_any(loader: Any, index: int = 0) -> dict:
    """``loader.peek(index)``; under ``on_error="skip"``, the next batch that reads cleanly
    when that one holds a failing sample (shapes are what is wanted, not that batch).
    No worker starts and the cursor does not move."""
    n = len(loader)
    first_error = None
    for i in range(n):
        try:
            return loader.peek((index + i) % n)
        except SampleError as error:
            if loader.config.failure.on_error != "skip":
                raise
            first_error = first_error or error
    if first_error is None:
        raise ValueError(f"{loader!r} has no batches")
    raise first_error


def fixed_batch_size(loader: Any) -> int | None:
    """The row count every batch has, or None when batches may be shorter.

    ``last_batch="pad"`` keeps every batch full (a failing sample becomes a masked row);
    ``"drop"`` keeps only full batches unless ``on_error="skip"`` removes rows from them.
    """
    read, on_error = loader.config.read, loader.config.failure.on_error
    if read.last_batch == "pad" or (read.last_batch == "drop" and on_error == "raise"):
        return read.batch_size
    return None


def padded_keys(loader: Any, batch: dict) -> set[str]:
    """The keys whose per-sample dimensions vary from batch to batch: under ``collate="pad"``,
    those padded to their batch's largest shape (each has a ``"<key>_shape"``)."""
    if loader.config.read.collate != "pad":
        return set()
    return {key for key in batch if key + SHAPE_SUFFIX in batch}
