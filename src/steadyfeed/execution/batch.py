"""Carrying out one batch task: read, transform, collate. Runs inside a worker.

This is the only place that touches the source and the transform, so inline,
thread and process execution produce bit-identical batches by construction.
"""
from __future__ import annotations

import time
import traceback
from typing import Callable, Mapping

import numpy as np

from ..sampling.seeds import SampleStreams
from ..sources.base import as_sample, read_columns, read_many
from .task import BatchResult, BatchTask, SampleFailure, Stage, StatusSlot, WorkContext

# allocate(specs) -> {key: empty array}; specs is {key: (shape, dtype)}
Allocator = Callable[[dict], dict]


def numpy_allocator(specs: dict) -> dict:
    return {key: np.empty(shape, dtype) for key, (shape, dtype) in specs.items()}


def _failure(position: int, sample_id: int, attempts: int, exc: BaseException) -> SampleFailure:
    return SampleFailure(
        position=position,
        sample_id=sample_id,
        attempts=attempts,
        error_type=type(exc).__name__,
        message=str(exc),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        exception=exc,
    )


class _Reader:
    """Reads and transforms one sample at a time, with the retry bound."""

    def __init__(self, task: BatchTask, ctx: WorkContext):
        self.task, self.ctx = task, ctx
        self.streams = SampleStreams(ctx.seed) if ctx.transform is not None else None
        spec = task.spec
        self.prefetched: dict[int, Mapping] = {}
        self.columns: dict[str, np.ndarray] | None = None  # the whole batch, stacked: the fast path
        self.read_seconds = 0.0
        self.transform_seconds = 0.0
        if task.batched_read and not task.prior_attempts and not task.excluded:
            t0 = time.perf_counter()
            if ctx.transform is None:
                self.columns = read_columns(ctx.source, spec.ids)
            if self.columns is None:
                batch = read_many(ctx.source, spec.ids)
                if batch is not None:
                    self.prefetched = dict(enumerate(batch))
            self.read_seconds += time.perf_counter() - t0

    def sample(self, position: int) -> dict | SampleFailure:
        spec, ctx = self.task.spec, self.ctx
        sample_id = int(spec.ids[position])
        draw = 0 if spec.draws is None else int(spec.draws[position])
        attempts = self.task.prior_attempts.get(position, 0)
        while True:
            attempts += 1
            try:
                t0 = time.perf_counter()
                raw = self.prefetched.pop(position, None)
                if raw is None:
                    raw = ctx.source[sample_id]
                t1 = time.perf_counter()
                self.read_seconds += t1 - t0
                sample = dict(raw)
                if ctx.transform is not None:
                    sample = ctx.transform(sample, self.streams.rng(self.task.epoch, sample_id, draw))
                sample = as_sample(sample)
                self.transform_seconds += time.perf_counter() - t1
                return sample
            except Exception as exc:  # noqa: BLE001 - any sample failure is reported, never swallowed
                if attempts > ctx.retries:
                    return _failure(position, sample_id, attempts, exc)


def _mismatch(samples: dict[int, dict], spec_ids, ref_pos: int) -> tuple[int, str] | None:
    """The first position whose keys, shapes or dtypes differ from the reference sample."""
    ref = samples[ref_pos]
    for pos, sample in samples.items():
        if sample.keys() != ref.keys():
            return pos, (
                f"sample {spec_ids[pos]} has keys {sorted(sample)} but sample {spec_ids[ref_pos]} "
                f"(first of its batch) has {sorted(ref)}"
            )
        for key, arr in sample.items():
            r = ref[key]
            if arr.shape != r.shape or arr.dtype != r.dtype:
                return pos, (
                    f"key {key!r}: sample {spec_ids[pos]} has shape {arr.shape} {arr.dtype} but sample "
                    f"{spec_ids[ref_pos]} (first of its batch) has shape {r.shape} {r.dtype}"
                )
    return None


def _allocate(item_specs: dict, rows: int, spec, allocate: Allocator) -> dict[str, np.ndarray]:
    """Output arrays for ``rows`` rows of items shaped as in ``item_specs``, plus ``id`` and ``mask``."""
    specs = {key: ((rows,) + shape, dtype) for key, (shape, dtype) in item_specs.items()}
    specs["id"] = ((rows,), np.dtype(np.int64))
    if spec.pad_to is not None:
        specs["mask"] = ((rows,), np.dtype(np.float32))
    return allocate(specs)


def _label_rows(out: dict, ids: np.ndarray, spec) -> None:
    """Fill ``id`` (-1 on padded rows) and ``mask`` (0 on padded rows) for ``len(ids)`` real rows."""
    real = len(ids)
    out["id"][:real] = ids
    out["id"][real:] = -1
    if spec.pad_to is not None:
        out["mask"][:real] = 1.0
        out["mask"][real:] = 0.0


def collate(samples: dict[int, dict], task: BatchTask, allocate: Allocator) -> dict[str, np.ndarray] | None:
    """Stack the samples (ordered by position) into fresh arrays, with ``id`` and, when padding, ``mask``."""
    spec = task.spec
    real = [p for p in sorted(samples) if p < spec.num_real]
    rows = spec.pad_to if spec.pad_to is not None else len(real)
    if not samples or rows == 0:
        return None
    first = samples[min(samples)]
    out = _allocate({key: (arr.shape, arr.dtype) for key, arr in first.items()}, rows, spec, allocate)
    for row, pos in enumerate(real):
        for key, arr in samples[pos].items():
            out[key][row] = arr
    for key, arr in first.items():  # padded rows repeat a real row; the mask hides them
        out[key][len(real):] = arr
    _label_rows(out, spec.ids[real], spec)
    return out


def _ownable(column: np.ndarray) -> bool:
    return type(column) is np.ndarray and column.flags.writeable and column.flags.c_contiguous


def collate_columns(columns: dict[str, np.ndarray], task: BatchTask, allocate: Allocator) -> dict[str, np.ndarray]:
    """The fast path: a batch read as stacked columns goes into the output in one copy per key."""
    spec = task.spec
    real = spec.num_real
    if allocate is numpy_allocator and spec.pad_to is None and all(_ownable(col) for col in columns.values()):
        # read_batch hands over fresh arrays (its contract): keep them instead of copying again
        return {**columns, "id": spec.ids[:real].copy()}
    rows = spec.pad_to if spec.pad_to is not None else real
    out = _allocate({key: (col.shape[1:], col.dtype) for key, col in columns.items()}, rows, spec, allocate)
    for key, col in columns.items():
        out[key][:real] = col[:real]
        out[key][real:] = col[0]  # padded rows repeat a real row; the mask hides them
    _label_rows(out, spec.ids[:real], spec)
    return out


def run_batch(task: BatchTask, ctx: WorkContext, status: StatusSlot, allocate: Allocator = numpy_allocator,
              should_stop: Callable[[], bool] = lambda: False) -> BatchResult:
    spec = task.spec
    status.begin(task.task_id, Stage.READING_BATCH)
    reader = _Reader(task, ctx)
    if reader.columns is not None:
        status.begin(task.task_id, Stage.COLLATING)
        t0 = time.perf_counter()
        arrays = collate_columns(reader.columns, task, allocate)
        timings = {"read": reader.read_seconds, "transform": 0.0, "collate": time.perf_counter() - t0}
        status.idle()
        return BatchResult(task.task_id, spec.index, arrays, (), timings)
    samples: dict[int, dict] = {}
    failures: list[SampleFailure] = []
    for position in range(len(spec.ids)):
        if position in task.excluded:
            continue
        if should_stop() or (failures and ctx.stop_on_failure):
            break
        status.begin(task.task_id, position)
        outcome = reader.sample(position)
        if isinstance(outcome, SampleFailure):
            failures.append(outcome)
        else:
            samples[position] = outcome
    status.begin(task.task_id, Stage.COLLATING)
    t0 = time.perf_counter()
    while samples and not (failures and ctx.stop_on_failure):
        bad = _mismatch(samples, spec.ids, min(samples))
        if bad is None:
            break
        pos, message = bad
        del samples[pos]
        failures.append(_failure(pos, int(spec.ids[pos]), task.prior_attempts.get(pos, 0) + 1, ValueError(message)))
    arrays = None if (failures and ctx.stop_on_failure) else collate(samples, task, allocate)
    timings = {
        "read": reader.read_seconds,
        "transform": reader.transform_seconds,
        "collate": time.perf_counter() - t0,
    }
    status.idle()
    return BatchResult(task.task_id, spec.index, arrays, tuple(sorted(failures, key=lambda f: f.position)), timings)
