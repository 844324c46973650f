"""``pack``: turn any source, or any iterable of sample dicts, into indexed TFRecord shards.

The output directory holds ``shard-00000-of-0000N.tfrecord`` files of ``tf.train.Example``
records (each feature one raw bytes value, see ``steadyfeed.sources.tfrecord``), an offset
index ``<shard>.sfidx.npy`` beside each, and ``manifest.json`` (format, version, sample
count, feature specs, shards and their record counts).

Guarantees:

* record ``i`` (across shards in name order) is sample ``i`` of the source, or the ``i``-th
  item of the iterable, bit-exact: ``TFRecordSource(out_dir)[i]`` equals it in every key,
  dtype, shape and byte; the output bytes do not depend on ``workers`` or ``mode``;
* every sample has the keys, dtypes and shapes of the first, or packing stops with a
  DataError naming the sample, the key, what was expected and what was found (under any
  ``on_error``: a sample that reads fine is never dropped for disagreeing with another);
* ``on_error="skip"``: a sample that fails to *read* is left out, and listed under
  ``"quarantine"`` in the manifest (id, where it lives, the error; the same entries as
  ``Loader.quarantine_report()``); record ``i`` is then the ``i``-th sample that read. More
  failures than ``max_error_fraction`` of the samples raise ``TooManyErrors``;
* the dataset appears whole or not at all: everything is written (and fsynced) into a hidden
  ``.<name>.partial-*`` directory beside ``out_dir``, renamed to ``out_dir`` only once
  complete; an error removes it, a crash leaves only that hidden directory;
* a filesystem that fills up raises ``DiskFull`` naming ``out_dir`` and the bytes the pack
  needs (estimated from the records written so far), with the hidden directory removed; the
  source is only read, never changed;
* the directory and files get the modes the umask gives (``files.py``), so another account
  can read the shards;
* ``tf.data.TFRecordDataset`` reads the shards as they are.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Generator, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .config import FailureOptions, OnError
from .errors import DataError, SampleError, TooManyErrors
from .files import disk_full, fsync_directory, is_full, staging_directory
from .loader import Loader
from .progress import progress_bar
from .quarantine import QuarantineEntry
from .sources.base import close_source, locate, read_many
from .sources.tfrecord import (
    FRAMING_BYTES,
    INDEX_SUFFIX,
    MANIFEST_NAME,
    FeatureSpec,
    RecordWriter,
    check_sample,
    encode_example,
    index_path,
    infer_specs,
    manifest_dict,
    require_support,
    save_index,
)

DEFAULT_SHARD_SIZE = 10_000
INDEX_ROW_BYTES = 16  # each record's (offset, length) in its shard's index
CHUNK_BYTES = 4 << 20  # encoded bytes per worker task: big enough to amortize a task, small enough to bound memory
MAX_CHUNK = 256


def pack(
    source: Any,
    out_dir: str | os.PathLike[str],
    shard_size: int = DEFAULT_SHARD_SIZE,
    *,
    workers: int = 0,
    mode: str = "thread",
    progress: bool = True,
    on_error: OnError = "raise",
    max_error_fraction: float = 0.1,
) -> Path:
    """Write ``source`` (``len`` + ``getitem``) or an iterable of sample dicts to ``out_dir``.

    ``shard_size`` records go in each shard. A source is read and encoded by a Loader with
    ``workers`` (``mode`` "thread" or "process"), in chunks written in sample id order; an
    iterable (e.g. a legacy generator) is consumed once, in this thread, and needs no len.
    ``on_error="skip"`` leaves out the samples that fail to read and lists them in the
    manifest (see the module docstring). ``progress`` shows a tqdm bar on stderr.
    ``out_dir`` must not exist or be empty. Returns ``out_dir`` as a Path, ready for
    ``TFRecordSource(out_dir)``. A source with ``add_to_pack(directory)`` writes what it keeps
    beside the shards there, before the directory appears (``ImageFolder.encoded(decoded=...)``:
    a share of the images decoded).
    """
    if int(shard_size) < 1:
        raise ValueError(f"shard_size must be >= 1 records, got {shard_size}")
    skipped = _Skipped(FailureOptions(on_error=on_error, max_error_fraction=max_error_fraction))  # validates them
    require_support()
    out_dir = Path(out_dir)
    _check_target(out_dir)
    is_source = hasattr(source, "__len__") and hasattr(source, "__getitem__")
    if workers and not is_source:
        raise ValueError("workers need a source with __len__ and __getitem__; an iterable is read once, in order")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(staging_directory(out_dir))
    shards = _Shards(staging, int(shard_size))
    try:
        encoder = SampleEncoder()
        chunks = (
            _source_chunks(source, encoder, workers, mode, skipped)
            if is_source
            else _iterable_chunks(source, encoder, skipped)
        )
        bar = progress_bar(
            len(source) if is_source else None, f"pack {out_dir.name}", unit=" samples", enabled=progress, leave=True
        )
        with contextlib.closing(chunks), bar:
            counts = _write_shards(chunks, shards, bar)
        skipped.check(sum(counts) + len(skipped.entries), final=True)
        _finish(staging, counts, encoder.specs or {}, skipped.report())
        _add_beside(source, staging)
        _publish(staging, out_dir)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_full(exc):
            raise _no_room(out_dir, shards, len(source) if is_source else None) from exc
        raise
    return out_dir


def _no_room(out_dir: Path, shards: _Shards, total: int | None):
    """DiskFull for a pack that filled its filesystem: the bytes it needs, estimated from the
    records written so far (at least those, for an iterable of unknown length)."""
    written, records = shards.bytes, shards.records
    if total and records:
        needed, how = written * total // records, f"estimated from the {records:,} of {total:,} samples written"
    else:
        needed, how = written, "at least: what was written before it filled"
    return disk_full(
        out_dir,
        needed,
        what="the pack",
        how=how,
        then="nothing was published, and the hidden staging directory is removed",
    )


# -- encoding -------------------------------------------------------------------------------------
class SampleEncoder:
    """Serializes samples as tf.train.Example records; the first sample sets ``specs``, and
    any later sample whose keys, dtypes or shapes differ raises DataError."""

    def __init__(self, specs: dict[str, FeatureSpec] | None = None):
        self.specs = specs

    def __call__(self, sample: Any) -> bytes:
        if self.specs is None:
            self.specs = infer_specs(sample)
        check_sample(sample, self.specs)
        return encode_example(sample, self.specs)


def _named(sample_id: int, where: str | None, exc: Exception) -> DataError:
    """The error for sample ``sample_id``: packing stops at the first bad sample, saying which."""
    cause = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
    return DataError(f"sample {sample_id}{f' ({where})' if where else ''}: {cause}")


class _Skipped:
    """The samples left out under on_error="skip", and the max_error_fraction bound."""

    def __init__(self, policy: FailureOptions):
        self.policy = policy
        self.entries: list[QuarantineEntry] = []

    @property
    def skip(self) -> bool:
        return self.policy.on_error == "skip"

    def add(self, entries: list[dict]) -> None:
        self.entries += [QuarantineEntry(**e) for e in entries]

    def check(self, total: int, final: bool = False) -> None:
        """TooManyErrors past the bound: ``total`` is every sample, or (``final``) every one seen."""
        if self.entries and len(self.entries) > self.policy.max_error_fraction * total:
            last = self.entries[-1]
            raise TooManyErrors(
                f"{len(self.entries)} of {total} samples failed to read, more than max_error_fraction="
                f"{self.policy.max_error_fraction}; last: sample {last.sample_id}"
                f"{f' ({last.location})' if last.location else ''}: {last.error_type}: {last.message}"
            )

    def report(self) -> list[dict]:
        return [asdict(e) for e in self.entries]


def _entry(sample_id: int, chunk: int, where: str | None, exc: BaseException) -> dict:
    return asdict(
        QuarantineEntry(
            sample_id=sample_id,
            epoch=0,
            batch_index=chunk,
            attempts=1,
            error_type=type(exc).__name__,
            message=str(exc),
            location=where,
        )
    )


class _EncodedChunks:
    """A source whose item ``c`` is chunk ``c`` of another source, read and encoded:
    ``{"data": the records back to back (uint8), "lengths": each record's length}``.

    The Loader runs it with batch_size=1, so workers read and encode chunks in parallel
    and the consumer receives them in chunk order, i.e. sample id order. With ``skip``, a
    sample that fails to read is left out of its chunk and described in ``"failed"`` (the
    quarantine entries as JSON bytes), so the other samples of its chunk are kept.
    """

    def __init__(self, source: Any, encoder: SampleEncoder, chunk: int, skip: bool = False):
        self.source, self.encoder, self.chunk, self.skip = source, encoder, chunk, skip

    def __len__(self) -> int:
        return math.ceil(len(self.source) / self.chunk)

    def __getitem__(self, c: int) -> dict:
        ids = list(range(c * self.chunk, min((c + 1) * self.chunk, len(self.source))))
        found = read_many(self.source, ids)
        samples: list[Any] = [None] * len(ids) if found is None else found  # None: read one by one
        records, failed = [], []
        for i, sample in zip(ids, samples):
            try:
                sample = self.read(i) if sample is None else sample
            except DataError as exc:
                if not self.skip:
                    raise
                failed.append(_entry(i, c, locate(self.source, i), exc.__cause__ or exc))
                continue
            records.append(self.encode(i, sample))
        return {
            "data": np.frombuffer(b"".join(records), dtype=np.uint8),
            "lengths": np.array([len(r) for r in records], dtype=np.int64),
            "failed": np.frombuffer(json.dumps(failed).encode(), dtype=np.uint8),
        }

    def read(self, i: int) -> Any:
        try:
            return self.source[i]
        except Exception as exc:  # name the sample: the Loader only knows the chunk number
            raise _named(i, locate(self.source, i), exc) from exc

    def encode(self, i: int, sample: Any = None) -> bytes:
        """The record of sample ``i``; a sample unlike the first raises under any on_error."""
        sample = self.read(i) if sample is None else sample
        try:
            return self.encoder(sample)
        except Exception as exc:
            raise _named(i, locate(self.source, i), exc) from exc

    def close(self) -> None:
        close_source(self.source)


def _split(data: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths)
    return [data[start:end].tobytes() for start, end in zip(ends - lengths, ends)]


def _first_record(source: Any, encoder: SampleEncoder, skip: bool) -> bytes:
    """The first sample that reads, encoded: it sets ``encoder.specs`` before workers get a copy
    (under skip, the samples before it are read again, and quarantined, by the chunks)."""
    probe = _EncodedChunks(source, encoder, 1)
    for i in range(len(source)):
        try:
            sample = probe.read(i)
        except DataError:
            if skip:
                continue
            raise
        return probe.encode(i, sample)
    return b""


def _source_chunks(
    source: Any, encoder: SampleEncoder, workers: int, mode: str, skipped: _Skipped
) -> Generator[list[bytes], None, None]:
    """The source's records, a chunk at a time, in sample id order."""
    if len(source) == 0:
        return
    first = _first_record(source, encoder, skipped.skip)
    chunk = max(1, min(MAX_CHUNK, CHUNK_BYTES // max(1, len(first))))
    with Loader(_EncodedChunks(source, encoder, chunk, skipped.skip), 1, workers=workers, mode=mode) as loader:
        try:
            for batch in loader:
                skipped.add(json.loads(batch["failed"][0].tobytes()))
                skipped.check(len(source))
                yield _split(batch["data"][0], batch["lengths"][0])
        except SampleError as exc:
            # the DataError we raised names the sample; the SampleError's id is a chunk number
            if isinstance(exc.__cause__, DataError):
                raise exc.__cause__  # noqa: B904 - its own cause (the read error) is kept
            raise


def _iterable_chunks(
    iterable: Iterable, encoder: SampleEncoder, skipped: _Skipped
) -> Generator[list[bytes], None, None]:
    """An iterable's records one at a time. Nothing is skipped here: a generator that raises
    cannot go on, and a sample unlike the first is not the sample's failure."""
    for i, sample in enumerate(iterable):
        try:
            yield [encoder(sample)]
        except DataError as exc:
            raise _named(i, None, exc) from exc


# -- writing ---------------------------------------------------------------------------------------
def _shard_name(number: int, total: int | None = None) -> str:
    """``shard-00003.tfrecord`` while writing; ``shard-00003-of-00010.tfrecord`` once the total is known."""
    return f"shard-{number:05d}.tfrecord" if total is None else f"shard-{number:05d}-of-{total:05d}.tfrecord"


class _Shards:
    """Numbered shards of ``shard_size`` records in ``directory``, each sealed with its index."""

    def __init__(self, directory: Path, shard_size: int):
        self.directory, self.shard_size = directory, shard_size
        self.counts: list[int] = []
        self.records = self.bytes = 0  # written so far, framing and index rows included
        self._writer: RecordWriter | None = None

    def write(self, record: bytes) -> None:
        if self._writer is not None and len(self._writer) == self.shard_size:
            self.seal()
        if self._writer is None:
            self._writer = RecordWriter(self.directory / _shard_name(len(self.counts)))
        self._writer.write(record)
        self.records += 1
        self.bytes += len(record) + FRAMING_BYTES + INDEX_ROW_BYTES

    def seal(self) -> None:
        """Close the open shard and write its index (from the offsets kept while writing)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            rows = writer.close()
            save_index(writer.path, rows, index_path(writer.path))
            self.counts.append(len(rows))

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _write_shards(chunks: Iterator[list[bytes]], shards: _Shards, bar) -> list[int]:
    """Write every record; returns each shard's record count."""
    try:
        for records in chunks:
            for record in records:
                shards.write(record)
            bar.update(len(records))
        shards.seal()
    finally:
        shards.abandon()
    return shards.counts


def _finish(directory: Path, counts: list[int], specs: dict[str, FeatureSpec], quarantine: list[dict]) -> None:
    """Give shards their final names (their number is known now) and write the manifest, last."""
    names = []
    for number, count in enumerate(counts):
        final = _shard_name(number, len(counts))
        for suffix in ("", INDEX_SUFFIX):  # rename keeps the mtime, so the index stays valid
            os.rename(directory / (_shard_name(number) + suffix), directory / (final + suffix))
        names.append((final, count))
    with open(directory / MANIFEST_NAME, "w", encoding="utf-8") as f:
        json.dump(manifest_dict(sum(counts), specs, names, quarantine), f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def _add_beside(source: Any, directory: Path) -> None:
    """What the source's packed form keeps beside the shards, if anything, inside the same
    atomic directory (``source.add_to_pack(directory)``: an image folder's decoded share,
    ``ImageFolder.encoded(decoded=...)``)."""
    add = getattr(source, "add_to_pack", None)
    if add is not None:
        add(directory)


def _check_target(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not an empty directory: pack does not overwrite")


def _publish(staging: Path, out_dir: Path) -> None:
    """One rename makes the finished dataset appear (it may replace an empty directory)."""
    fsync_directory(staging)
    os.rename(staging, out_dir)
    fsync_directory(out_dir.parent)
