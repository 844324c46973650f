"""Carrying out one batch task: read, transform, collate. Runs inside a worker.

This is the only place that touches the source and the transform, so inline,
thread and process execution produce bit-identical batches by construction.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import CollateError
from ..sampling.seeds import SampleStreams
from ..sources.base import (
    NO_FDS,
    Allocator,
    as_sample,
    fd_limit_note,
    locate,
    native,
    numpy_allocator,
    read_columns,
    read_many,
    reads_into,
)
from .task import BatchResult, BatchTask, Disagreement, SampleFailure, Stage, StatusSlot, WorkContext


def _failure(position: int, sample_id: int, attempts: int, exc: BaseException) -> SampleFailure:
    message = str(exc)
    if isinstance(exc, OSError) and exc.errno in NO_FDS and "ulimit -n" not in message:  # not said yet
        message = f"{message}: {fd_limit_note()}"
    return SampleFailure(
        position=position,
        sample_id=sample_id,
        attempts=attempts,
        error_type=type(exc).__name__,
        message=message,
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        exception=exc,
    )


class _Placed:
    """The ``allocate`` a source's ``read_batch`` is given (``read_columns``) when the batch
    goes into memory of the worker's choosing (a shared-memory slot): the columns are made in
    the batch's output, ``id`` beside them, so collating them copies nothing. Only a batch
    that is the columns as they are qualifies (no padding, stacked, native byte order, no
    objects, one row per id); for anything else the source gets fresh arrays, copied as before."""

    def __init__(self, spec, allocate: Allocator):
        self._spec, self._allocate = spec, allocate
        self.out: dict[str, np.ndarray] | None = None

    def __call__(self, specs: dict) -> dict:
        specs = {key: (tuple(shape), np.dtype(dtype)) for key, (shape, dtype) in specs.items()}
        rows = len(self._spec.ids)
        if self.out is not None or "id" in specs or any(_unplaceable(s, d, rows) for s, d in specs.values()):
            return numpy_allocator(specs)
        self.out = _allocate(
            {key: (shape[1:], dtype) for key, (shape, dtype) in specs.items()}, rows, self._spec, self._allocate
        )
        return {key: self.out[key] for key in specs}

    def holds(self, columns: dict[str, np.ndarray]) -> bool:
        """Whether ``columns`` are the very arrays placed in the output (nothing to copy)."""
        out = self.out
        return out is not None and len(out) == len(columns) + 1 and all(out.get(k) is col for k, col in columns.items())


def _unplaceable(shape: tuple, dtype: np.dtype, rows: int) -> bool:
    """A column the batch's output cannot be: not one row per id, another byte order, or
    objects (pointers into one process's memory: an HDF5 dataset of variable-length strings)."""
    return shape[:1] != (rows,) or not dtype.isnative or dtype.hasobject


class _Reader:
    """Reads and transforms one sample at a time, with the retry bound."""

    def __init__(self, task: BatchTask, ctx: WorkContext, placed: _Placed | None = None):
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
                self.columns = read_columns(ctx.source, spec.ids, placed)
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
                    assert self.streams is not None  # made with the transform
                    sample = ctx.transform(sample, self.streams.rng(self.task.epoch, sample_id, draw))
                sample = as_sample(sample)
                self.transform_seconds += time.perf_counter() - t1
                return sample
            except Exception as exc:  # noqa: BLE001 - any sample failure is reported, never swallowed
                if attempts > ctx.retries:
                    return _failure(position, sample_id, attempts, exc)


# -- collation ------------------------------------------------------------------------------------
# "stack": every sample of a batch has the same keys, shapes and dtypes (byte order aside: as_sample
# makes it native), so a batch is the samples stacked and every batch has one layout. "pad": each
# key is padded (with zeros, empty strings) to the largest shape of its batch, strings to the widest,
# and "<key>_shape" (int64, rows x ndim) holds each row's true shape, for every key of one or more
# dimensions (always, not only where shapes differ, so every batch has the same keys).
SHAPE_SUFFIX = "_shape"


def _text(shape: tuple, dtype: np.dtype) -> str:
    return f"shape {shape} {dtype}"


def _string_kind(a: np.dtype, b: np.dtype) -> bool:
    """Both fixed-width strings of one kind (bytes ``S`` or text ``U``), whatever their widths."""
    return a.kind == b.kind and a.kind in "SU"


def layout_conflict(a: tuple[tuple, np.dtype], b: tuple[tuple, np.dtype], collate: str) -> str | None:
    """Why two values ``(shape, dtype)`` of one key cannot share a batch under ``collate``
    ("shape", "dtype", "strings": of different widths, or "ndim"), or None when they can. The
    one rule, also used by ``steadyfeed inspect`` to say what a loader would refuse."""
    (a_shape, a_dtype), (b_shape, b_dtype) = a, b
    if collate == "stack":
        if a_shape != b_shape:
            return "shape"
        return None if a_dtype == b_dtype else "strings" if _string_kind(a_dtype, b_dtype) else "dtype"
    if len(a_shape) != len(b_shape):
        return "ndim"
    return "dtype" if a_dtype != b_dtype and not _string_kind(a_dtype, b_dtype) else None


def find_disagreement(samples: dict[int, dict], ids, collate: str) -> Disagreement | None:
    """The first sample (by position) whose keys, shapes or dtypes cannot be collated with
    the batch's first sample, or a key that ``collate="pad"`` would add that is already there."""
    ref_pos = min(samples)
    ref, ref_id = samples[ref_pos], int(ids[ref_pos])
    if collate == "pad":
        clash = next((k for k, a in ref.items() if a.ndim and k + SHAPE_SUFFIX in ref), None)
        if clash is not None:
            return Disagreement("name", clash + SHAPE_SUFFIX, (ref_id,), (f"keys {sorted(ref)}",), collate)
    for pos, sample in samples.items():
        if sample.keys() != ref.keys():
            found = (f"keys {sorted(ref)}", f"keys {sorted(sample)}")
            return Disagreement("keys", None, (ref_id, int(ids[pos])), found, collate)
        for key, arr in sample.items():
            r = ref[key]
            what = layout_conflict((r.shape, r.dtype), (arr.shape, arr.dtype), collate)
            if what is not None:
                return Disagreement(
                    what, key, (ref_id, int(ids[pos])), (_text(r.shape, r.dtype), _text(arr.shape, arr.dtype)), collate
                )
    return None


_FIXES = {
    "shape": "give every sample one shape (a fixed size at the source, e.g. ImageFolder(size=(h, w)), or a "
    "transform that resizes, crops or pads), or pass collate='pad' to pad each batch to its largest "
    "shape, with '{key}_shape' holding each row's true shape",
    "strings": "strings of different lengths: pass collate='pad', which pads them to the widest of the batch "
    "(or make them one length in a transform)",
    "dtype": "give every sample one dtype: cast it at the source or in a transform (e.g. "
    "sample[{key!r}].astype('float32')); collate='pad' pads shapes, it does not cast",
    "ndim": "collate='pad' pads each dimension but needs the same number of dimensions in every sample: "
    "reshape in a transform",
    "keys": "give every sample the same keys: add or drop keys in a transform",
    "name": "collate='pad' adds '{key}' for a key's true shapes: rename the samples' own key in a transform",
}


def conflict_fix(what: str, key: str = "x") -> str:
    """How to fix a conflict of kind ``what`` (``layout_conflict``'s answer) for ``key``."""
    return _FIXES[what].format(key=key)


def collate_error(d: Disagreement, source, epoch: int, batch_index: int) -> CollateError:
    """The consumer's error for a batch that cannot be collated: both samples, where they
    live, what each has, and how to fix it."""
    where = tuple(locate(source, i) for i in d.ids)
    named = [f"sample {i}{f' ({w})' if w else ''}" for i, w in zip(d.ids, where)]
    if d.what == "name":
        found = f"{named[0]}, the first of its batch, already has a key {d.key!r}"
    else:
        found = (
            f"key {d.key!r}: " if d.key is not None else ""
        ) + f"{named[1]} has {d.found[1]} but {named[0]}, the first of its batch, has {d.found[0]}"
    fix = conflict_fix(d.what, d.key or "x")
    message = (
        f"cannot collate batch {batch_index} of epoch {epoch} (collate={d.collate!r}): {found}. Each "
        f"sample read fine, so none is skipped or quarantined (raised under any on_error). Fix: {fix}."
    )
    return CollateError(
        message,
        epoch=epoch,
        batch_index=batch_index,
        key=d.key,
        sample_ids=d.ids,
        locations=where,
        found=d.found,
        collate=d.collate,
    )


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


def _item_specs(samples: list[dict], collate: str) -> dict[str, tuple[tuple, np.dtype]]:
    """Each key's row shape and dtype in the batch (samples already agree, see find_disagreement)."""
    first = samples[0]
    if collate == "stack":
        return {key: (arr.shape, arr.dtype) for key, arr in first.items()}
    specs = {}
    for key, arr in first.items():
        shape = tuple(np.max([s[key].shape for s in samples], axis=0).tolist()) if arr.ndim else ()
        dtype = max((s[key].dtype for s in samples), key=lambda d: d.itemsize) if arr.dtype.kind in "SU" else arr.dtype
        specs[key] = (shape, dtype)
    specs.update({key + SHAPE_SUFFIX: ((arr.ndim,), np.dtype(np.int64)) for key, arr in first.items() if arr.ndim})
    return specs


def _put(out: dict, rows, sample: dict, collate: str) -> None:
    """Write ``sample`` into row(s) ``rows`` (an int or a slice) of ``out``; under "pad" the part
    beyond its own shape is zeroed (an output slot may hold an earlier batch's bytes)."""
    for key, arr in sample.items():
        column = out[key]
        if collate == "pad" and arr.ndim:
            out[key + SHAPE_SUFFIX][rows] = arr.shape
            if arr.shape != column.shape[1:]:
                dest = column[rows, ...]  # a view, also of one row
                dest[...] = np.zeros((), column.dtype)
                dest[(Ellipsis,) + tuple(slice(0, d) for d in arr.shape)] = arr
                continue
        column[rows] = arr


def collate(
    samples: dict[int, dict], task: BatchTask, allocate: Allocator, policy: str = "stack"
) -> dict[str, np.ndarray] | None:
    """Stack (or pad and stack) the samples, ordered by position, into fresh arrays, with ``id``
    and, when padding the last batch, ``mask``. The samples agree (see find_disagreement)."""
    spec = task.spec
    real = [p for p in sorted(samples) if p < spec.num_real]
    rows = spec.pad_to if spec.pad_to is not None else len(real)
    if not samples or rows == 0:
        return None
    first = samples[min(samples)]
    out = _allocate(_item_specs([samples[p] for p in sorted(samples)], policy), rows, spec, allocate)
    for row, pos in enumerate(real):
        _put(out, row, samples[pos], policy)
    if rows > len(real):  # padded rows repeat a real row; the mask hides them
        _put(out, slice(len(real), rows), first, policy)
    _label_rows(out, spec.ids[real], spec)
    return out


def _ownable(column: np.ndarray) -> bool:
    return type(column) is np.ndarray and column.flags.writeable and column.flags.c_contiguous and column.dtype.isnative


def collate_columns(
    columns: dict[str, np.ndarray],
    task: BatchTask,
    allocate: Allocator,
    policy: str = "stack",
    placed: _Placed | None = None,
) -> dict[str, np.ndarray]:
    """The fast path: a batch read as stacked columns goes into the output in one copy per key
    (native byte order; under "pad" every row has the column's shape, so "<key>_shape" is that),
    or in none when the source read them into the output itself (``placed``)."""
    spec = task.spec
    real = spec.num_real
    if placed is not None and placed.holds(columns):
        assert placed.out is not None  # holds() says so
        _label_rows(placed.out, spec.ids[:real], spec)
        return placed.out
    shapes = (
        {
            key + SHAPE_SUFFIX: np.tile(np.array(col.shape[1:], np.int64), (len(col), 1))
            for key, col in columns.items()
            if col.ndim > 1
        }
        if policy == "pad"
        else {}
    )
    if allocate is numpy_allocator and spec.pad_to is None and all(_ownable(col) for col in columns.values()):
        # read_batch hands over fresh arrays (its contract): keep them instead of copying again
        return {**columns, **shapes, "id": spec.ids[:real].copy()}
    rows = spec.pad_to if spec.pad_to is not None else real
    columns = {**columns, **shapes}
    out = _allocate({key: (col.shape[1:], native(col.dtype)) for key, col in columns.items()}, rows, spec, allocate)
    for key, col in columns.items():
        out[key][:real] = col[:real]
        out[key][real:] = col[0]  # padded rows repeat a real row; the mask hides them
    _label_rows(out, spec.ids[:real], spec)
    return out


def output_is_copied(ctx: WorkContext) -> bool:
    """Whether ``run_batch`` writes every batch of ``ctx`` into arrays its ``allocate`` gives, so
    that where they lie costs no copy. Not where a source's ``read_batch`` is called without
    one (it takes none, or ``collate="pad"``) and no transform runs: the batch keeps the
    arrays the source made (``collate_columns``), and arrays allocated for it would add a copy."""
    if ctx.transform is not None or not hasattr(ctx.source, "read_batch"):
        return True  # samples one by one, stacked into the output
    return reads_into(ctx.source) and ctx.collate == "stack"


def run_batch(
    task: BatchTask,
    ctx: WorkContext,
    status: StatusSlot,
    allocate: Allocator = numpy_allocator,
    should_stop: Callable[[], bool] = lambda: False,
) -> BatchResult:
    spec = task.spec
    status.begin(task.task_id, Stage.READING_BATCH)
    # a worker whose batches go elsewhere (a shared-memory slot) lets the source read into them
    places = allocate is not numpy_allocator and spec.pad_to is None and ctx.collate == "stack"
    placed = _Placed(spec, allocate) if places else None
    reader = _Reader(task, ctx, placed)
    if reader.columns is not None and not _clashes(reader.columns, ctx.collate):
        status.begin(task.task_id, Stage.COLLATING)
        t0 = time.perf_counter()
        arrays: dict[str, np.ndarray] | None = collate_columns(reader.columns, task, allocate, ctx.collate, placed)
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
    stopped = bool(failures) and ctx.stop_on_failure  # on_error="raise": the batch raises its first failure
    # a disagreement between samples that read fine is no sample's failure: nothing is dropped for it
    disagreement = find_disagreement(samples, spec.ids, ctx.collate) if samples and not stopped else None
    arrays = None if stopped or disagreement else collate(samples, task, allocate, ctx.collate)
    timings = {
        "read": reader.read_seconds,
        "transform": reader.transform_seconds,
        "collate": time.perf_counter() - t0,
    }
    status.idle()
    failures.sort(key=lambda f: f.position)
    return BatchResult(task.task_id, spec.index, arrays, tuple(failures), timings, disagreement)


def _clashes(columns: dict[str, np.ndarray], policy: str) -> bool:
    """Under "pad", a column named like a true-shape key of another: the per-sample path names it."""
    return policy == "pad" and any(col.ndim > 1 and key + SHAPE_SUFFIX in columns for key, col in columns.items())
