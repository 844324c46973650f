"""The options of a Loader: four documented dataclasses, one per concern, and their sum.

* :class:`ReadOptions`: what each batch holds and in which order the samples come;
* :class:`ExecutionOptions`: who makes the batches (workers, mode, prefetch);
* :class:`FailureOptions`: what a failing, hung or dying sample does;
* :class:`ShardOptions`: which part of the data this replica reads.

:class:`LoaderConfig` holds one of each and is what a :class:`~steadyfeed.Loader` runs on.
Every option is also a flat keyword of ``Loader(...)``, ``LoaderConfig.build(...)`` and
``loader.replace(...)``, named as its field, and a flag of every command line tool
(``tools/spec.py`` builds them from the fields below). Each field is written out once,
here, with its documentation; validation happens when an object is built, so a config
that exists is a valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .sampling.plan import LAST_BATCH_POLICIES, LastBatch

# The default prefetch, per worker. A worker holds two tasks (one running, one queued behind it:
# execution/pool.py), and batches that came back out of order, or before the consumer asked,
# wait in the same window; with two per worker those waiting batches took the queued tasks'
# places, and workers idled for tasks (npy pairs, 2 process workers on 2 cores: a quarter of
# their tasks found none queued; 4 per worker gave 1.1-1.2x the pairs/s, JPEG 1.03x). A process
# worker lends as many batches as a full window holds and more (execution/shm.py, LENT_SLOTS).
PREFETCH_PER_WORKER = 4

Mode = Literal["thread", "process", "ray"]
AUTO: Literal["auto"] = "auto"  # workers="auto": measured (execution/auto.py)
Transport = Literal["auto", "shm", "pipe"]
OnError = Literal["raise", "skip"]
Collate = Literal["stack", "pad"]

MODES: tuple[str, ...] = typing.get_args(Mode)
TRANSPORTS: tuple[str, ...] = typing.get_args(Transport)
ERROR_POLICIES: tuple[str, ...] = typing.get_args(OnError)
COLLATE_POLICIES: tuple[str, ...] = typing.get_args(Collate)


def option(default: Any = dataclasses.MISSING, *, doc: str, cli: bool = True, metavar: str | None = None) -> Any:
    """A documented field: ``doc`` is its documentation and its command line help; ``cli=False``
    for options a command line cannot express (a function, a sampler object)."""
    return field(default=default, metadata={"doc": doc, "cli": cli, "metavar": metavar})


def workers_count(workers: int | str | None) -> int:
    """``workers`` as a number of workers: unset (None) or "auto" not yet measured makes none."""
    return workers if isinstance(workers, int) else 0


def _documented(cls: type) -> type:
    """Append each field's documentation to the class docstring, so ``help()`` shows it."""
    lines = [
        f"    {f.name} (default {f.default!r}): {f.metadata['doc']}"
        if f.default is not dataclasses.MISSING
        else f"    {f.name} (required): {f.metadata['doc']}"
        for f in dataclasses.fields(cls)
    ]
    cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\n    Fields:\n\n" + "\n".join(lines) + "\n"
    return cls


def _id_tuple(ids: Any) -> tuple[int, ...]:
    """Sample ids (any iterable of integers) as a tuple of ints."""
    try:
        values = tuple(ids.tolist() if hasattr(ids, "tolist") else ids)
    except TypeError:
        raise ValueError(f"exclude takes sample ids, {{id: reason}} or a file, got {type(ids).__name__}") from None
    _need(all(_is_int(i) for i in values), "exclude takes integer sample ids")
    return tuple(int(i) for i in values)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    _need(value in choices, f"{name} must be one of {choices}, got {value!r}")


@_documented
@dataclass(frozen=True)
class ReadOptions:
    """What each batch holds and in which order the samples come.

    Guarantee: the order and content of every batch are a pure function of these options,
    the source and the shard, so any worker count, mode or resume gives the same batches."""

    batch_size: int = option(doc="samples per batch", metavar="N")
    shuffle: bool = option(False, doc="a fresh permutation of the samples every epoch, drawn from (seed, epoch)")
    seed: int = option(0, doc="the seed of the order and of every sample's transform stream", metavar="S")
    sampler: Any = option(
        None,
        cli=False,
        doc="an object with order(n, seed, epoch) or epoch_order(n, seed, epoch) "
        "(sampling/samplers.py) instead of shuffle",
    )
    transform: Callable | None = option(
        None, cli=False, doc="transform(sample, rng) -> sample, run in the workers with each sample's own random stream"
    )
    last_batch: LastBatch = option(
        "partial",
        doc="the last, short batch of an epoch: 'partial' keeps it, 'drop' leaves it out, "
        "'pad' fills it with masked rows (a float32 'mask' key)",
    )
    with_ids: bool = option(False, doc="add each batch's sample ids under the key 'id'")
    collate: Collate = option(
        "stack",
        doc="how samples become a batch: 'stack' needs one shape and dtype per key (a "
        "disagreement raises CollateError, under any on_error); 'pad' pads each key to "
        "the largest shape of its batch (strings to the widest) and adds '<key>_shape' "
        "(int64, rows x ndim) with each row's true shape",
    )
    exclude: Any = option(
        None,
        metavar="FILE",
        doc="sample ids left out of every epoch (exactly once over the rest): ids, {id: reason}, "
        "or a file: a JSON list of ids, findings or an audit report (--json), or a quarantine "
        "file (diagnostics/isolation.py); loader.exclude(ids, reason) adds more",
    )

    def __post_init__(self):
        _need(
            _is_int(self.batch_size) and self.batch_size >= 1,
            f"batch_size must be an int >= 1, got {self.batch_size!r}",
        )
        _need(_is_int(self.seed) and self.seed >= 0, f"seed must be >= 0 (an int), got {self.seed!r}")
        _one_of("last_batch", self.last_batch, LAST_BATCH_POLICIES)
        _one_of("collate", self.collate, COLLATE_POLICIES)
        _need(not (self.shuffle and self.sampler is not None), "pass either shuffle=True or a sampler, not both")
        _need(self.transform is None or callable(self.transform), "transform must be callable(sample, rng) -> dict")
        if self.exclude is not None and not isinstance(self.exclude, (str, os.PathLike, dict)):
            object.__setattr__(self, "exclude", _id_tuple(self.exclude))  # comparable and immutable, as a config is


@_documented
@dataclass(frozen=True)
class ExecutionOptions:
    """Who makes the batches. None of these options changes what a batch holds."""

    workers: int | Literal["auto"] | None = option(
        None,
        doc="worker threads, processes or Ray actors (0: the consumer makes every batch); 'auto': "
        "measured on the first batches, picks how many and the mode, thread or process "
        "(execution/auto.py; stats()['auto'] says what and why); None (the default): "
        "'auto' under as_keras() and the command line tools, 0 otherwise (and in Ray mode)",
        metavar="N|auto",
    )
    mode: Mode = option(
        "thread", doc="what a worker is: 'thread', 'process' (spawned) or 'ray' (an actor); workers='auto' picks it"
    )
    prefetch: int | None = option(
        None,
        doc=f"batches in flight or waiting, at most (default: {PREFETCH_PER_WORKER} tasks per worker, at least 1: "
        "that many batches a worker times the batches a task holds, batches_per_task)",
        metavar="N",
    )
    batches_per_task: int | Literal["auto"] = option(
        AUTO,
        doc="consecutive batches a thread or process worker makes as one task, cut apart again in "
        "the consumer (execution/grouping.py): the fixed cost of handing a task over is paid once "
        "for them, which counts where a batch takes a few milliseconds or less to make. Each batch "
        "is the same whatever the number, and a task whose samples fail is made again batch by "
        "batch. 'auto': 1 until 16 batches are timed after the pool's first (8 a worker, into fresh "
        "memory), then as many as make a task of ~50 ms, at "
        "most 8 (32 in process mode), within the memory and the prefetch allowed (stats()['batches_per_task']). A "
        "default prefetch grows with it",
        metavar="K|auto",
    )
    inline_when_faster: bool | None = option(
        None,
        doc="let the consumer make a batch itself when that measures faster "
        "than a worker (default: yes in thread and process mode without "
        "a timeout)",
    )
    worker_niceness: int = option(
        5, doc="how many nice steps below the consumer the workers run (0-19, Linux)", metavar="N"
    )
    max_inflight_bytes: int | None = option(
        None,
        doc="bytes of batches in flight or waiting, at most, besides prefetch "
        "(each batch not yet made counts as the largest made so far; one "
        "batch is always allowed, and until the first is made, one at a "
        "time). None: prefetch alone bounds them",
        metavar="BYTES",
    )
    transport: Transport = option(
        "auto",
        doc="how process workers hand batches over: 'auto' uses shared memory and, where "
        "/dev/shm cannot hold a batch, falls back to the workers' pipes (saying so "
        "once, in a warning and in stats()['transport']); 'shm' raises "
        "SharedMemoryFull instead; 'pipe' always uses the pipes (one more copy per "
        "batch, batches never in /dev/shm)",
    )
    pack_to: str | os.PathLike | None = option(
        None,
        metavar="DIR",
        doc="pack the source into TFRecord shards under DIR (keyed by its "
        "fingerprint) in the background during the first epoch, and read "
        "the shards from the next epoch and later runs on; batches are "
        "bit-identical (autopack.py)",
    )
    pack_decoded: float = option(
        0.0,
        metavar="SHARE",
        doc="with pack_to, for an image folder: the share of the images (0 to 1, spread "
        "evenly) whose decoded pixels the pack holds beside their bytes, so that reading "
        "them is a copy, not a decode: for epochs that decoding bounds (few cores, a fast "
        "disk), at the disk's cost (1: 8x a pack of 128 x 128 JPEGs; "
        "sources/decoded_pixels.py)",
    )

    def __post_init__(self):
        _need(
            self.workers in (None, AUTO) or (_is_int(self.workers) and self.workers >= 0),
            f"workers must be an int >= 0, 'auto' or None, got {self.workers!r}",
        )
        _one_of("mode", self.mode, MODES)
        _need(
            not (self.workers == AUTO and self.mode == "ray"),
            "workers='auto' picks thread or process workers on this machine; give Ray a number of actors",
        )
        _need(
            self.prefetch is None or (_is_int(self.prefetch) and self.prefetch >= 1),
            f"prefetch must be an int >= 1, got {self.prefetch!r}",
        )
        _need(
            self.batches_per_task == AUTO or (_is_int(self.batches_per_task) and self.batches_per_task >= 1),
            f"batches_per_task must be an int >= 1 or 'auto', got {self.batches_per_task!r}",
        )
        _need(
            self.inline_when_faster in (None, True, False),
            f"inline_when_faster must be None, True or False, got {self.inline_when_faster!r}",
        )
        _need(
            not (self.inline_when_faster and self.mode == "ray"),
            "inline_when_faster is for thread and process mode, not Ray",
        )
        _need(
            _is_int(self.worker_niceness) and 0 <= self.worker_niceness <= 19,
            f"worker_niceness must be an int from 0 (the consumer's priority) to 19, got {self.worker_niceness!r}",
        )
        _need(
            self.max_inflight_bytes is None or (_is_int(self.max_inflight_bytes) and self.max_inflight_bytes >= 1),
            f"max_inflight_bytes must be a byte count >= 1 (an int) or None, got {self.max_inflight_bytes!r}",
        )
        _one_of("transport", self.transport, TRANSPORTS)
        _need(
            isinstance(self.pack_decoded, (int, float))
            and not isinstance(self.pack_decoded, bool)
            and 0.0 <= self.pack_decoded <= 1.0,
            f"pack_decoded must be a share of the images in [0, 1], got {self.pack_decoded!r}",
        )
        _need(
            not self.pack_decoded or self.pack_to is not None,
            "pack_decoded is what a pack_to pack holds; give pack_to=DIR too",
        )

    @property
    def effective_prefetch(self) -> int:
        """``prefetch``, or ``PREFETCH_PER_WORKER`` per worker, at least 1 (1 while workers are
        unset or not yet measured). A default window is counted in tasks: the scheduler keeps
        it times the batches a task holds (``execution/grouping.py``)."""
        if self.prefetch is not None:
            return self.prefetch
        return max(PREFETCH_PER_WORKER * workers_count(self.workers), 1)

    def resolved(self, unset: int | Literal["auto"] = 0) -> ExecutionOptions:
        """These options with ``workers=None`` read as ``unset`` (0, or "auto" to be measured;
        0 in Ray mode, whose actors are counted, never measured)."""
        if self.workers is not None:
            return self
        return dataclasses.replace(self, workers=0 if self.mode == "ray" else unset)


@_documented
@dataclass(frozen=True)
class FailureOptions:
    """What a failing, hung or dying sample does. A failure always names the sample id, where
    it lives, the epoch, the batch and the attempts; it is never silent."""

    on_error: OnError = option(
        "raise", doc="'raise' a SampleError, or 'skip' the sample and record it in the quarantine report"
    )
    retries: int = option(
        0, doc="attempts per sample beyond the first (a hung or dying sample uses one each)", metavar="N"
    )
    timeout: float | None = option(
        None, doc="seconds one sample may run before it counts as hung (needs workers)", metavar="SECONDS"
    )
    max_error_fraction: float = option(
        0.1,
        doc="under 'skip', the share of an epoch's samples that may fail before TooManyErrors is raised",
        metavar="F",
    )
    quarantine: str | os.PathLike | None = option(
        None, doc="a file the skipped samples are appended to as JSON lines, as they happen", metavar="FILE"
    )

    def __post_init__(self):
        _one_of("on_error", self.on_error, ERROR_POLICIES)
        _need(_is_int(self.retries) and self.retries >= 0, f"retries must be an int >= 0, got {self.retries!r}")
        _need(self.timeout is None or self.timeout > 0, f"timeout must be > 0 seconds, got {self.timeout}")
        _need(
            0.0 <= self.max_error_fraction <= 1.0,
            f"max_error_fraction must be in [0, 1], got {self.max_error_fraction}",
        )


@_documented
@dataclass(frozen=True)
class ShardOptions:
    """Which part of the data this replica reads: the global order is split round-robin, so
    the shards of one epoch are disjoint and together complete."""

    shard_index: int = option(0, doc="this replica's shard, from 0", metavar="I")
    shard_count: int = option(1, doc="the number of shards (replicas)", metavar="R")

    def __post_init__(self):
        _need(
            _is_int(self.shard_count)
            and self.shard_count >= 1
            and _is_int(self.shard_index)
            and 0 <= self.shard_index < self.shard_count,
            f"need 0 <= shard_index < shard_count, got shard_index={self.shard_index!r}, "
            f"shard_count={self.shard_count!r}",
        )


GROUPS: dict[str, type[Any]] = {
    "read": ReadOptions,
    "execution": ExecutionOptions,
    "failure": FailureOptions,
    "sharding": ShardOptions,
}
# every flat option name -> the group that holds it
OPTION_GROUPS: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class LoaderConfig:
    """Every option of a Loader, one group per concern; checks the rules that span groups."""

    read: ReadOptions
    execution: ExecutionOptions = ExecutionOptions()
    failure: FailureOptions = FailureOptions()
    sharding: ShardOptions = ShardOptions()

    def __post_init__(self):
        for group, cls in GROUPS.items():
            if not isinstance(getattr(self, group), cls):
                raise TypeError(f"{group} must be a {cls.__name__}, got {type(getattr(self, group)).__name__}")
        _need(
            self.failure.timeout is None or self.execution.workers not in (None, 0),
            "timeout needs workers >= 1 (or 'auto'): a sample running in the consumer's own thread cannot be interrupted",
        )
        _need(
            not (self.execution.inline_when_faster and self.failure.timeout is not None),
            "inline_when_faster=True cannot go with a timeout: a batch made in the consumer cannot be interrupted",
        )

    @classmethod
    def build(cls, base: LoaderConfig | None = None, **options: Any) -> LoaderConfig:
        """A config from flat options (``batch_size=64, workers=4, ...``) and whole groups
        (``execution=ExecutionOptions(...)``), over ``base`` (default: every default).
        An option given both flat and inside a group it belongs to is refused."""
        groups = {name: given for name in GROUPS if (given := options.pop(name, None)) is not None}
        _renamed(options)
        unknown = [name for name in options if name not in OPTION_GROUPS]
        if unknown:
            raise TypeError(_unknown_message(unknown))
        fields = {} if base is None else {g: dataclasses.asdict(getattr(base, g)) for g in GROUPS}
        fields = {g: {**fields.get(g, {})} for g in GROUPS}
        for group, given in groups.items():
            if not isinstance(given, GROUPS[group]):
                raise TypeError(f"{group} must be a {GROUPS[group].__name__}, got {type(given).__name__}")
            twice = [n for n in options if OPTION_GROUPS[n] == group]
            if twice:
                raise TypeError(f"{', '.join(twice)} given both as keyword(s) and in {group}=")
            fields[group] = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
        for name, value in options.items():
            fields[OPTION_GROUPS[name]][name] = value
        if "batch_size" not in fields["read"]:
            raise TypeError("batch_size is required")
        return cls(**{g: GROUPS[g](**fields[g]) for g in GROUPS})

    def replace(self, **options: Any) -> LoaderConfig:
        """This config with some flat options or groups changed."""
        return LoaderConfig.build(self, **options)

    def options(self) -> dict[str, Any]:
        """Every option as a flat ``{name: value}``: ``LoaderConfig.build(**c.options()) == c``."""
        return {f.name: getattr(getattr(self, g), f.name) for g in GROUPS for f in dataclasses.fields(GROUPS[g])}

    @property
    def makes_batches_inline(self) -> bool:
        """With workers: whether the consumer may make a batch itself when that measures faster
        than handing it to a worker (``execution/handoff.py``). Unset: yes, in thread and process
        mode without a timeout (a batch made in the consumer cannot be interrupted)."""
        if self.execution.inline_when_faster is None:
            return self.execution.mode != "ray" and self.failure.timeout is None
        return self.execution.inline_when_faster


def option_fields() -> list[tuple[str, dataclasses.Field, Any]]:
    """``(group, field, resolved type)`` for every option, in declaration order (for the CLI)."""
    out = []
    for group, cls in GROUPS.items():
        hints = typing.get_type_hints(cls)
        out += [(group, f, hints[f.name]) for f in dataclasses.fields(cls)]
    return out


def _renamed(options: dict) -> None:
    """Turn deprecated spellings into the current ones, with a DeprecationWarning."""
    if "drop_last" in options:
        drop = options.pop("drop_last")
        warnings.warn(
            "drop_last is deprecated: pass last_batch='drop' (or 'partial', the default)",
            DeprecationWarning,
            stacklevel=4,
        )
        given = options.get("last_batch")
        if drop and given not in (None, "drop"):
            raise ValueError(f"drop_last=True contradicts last_batch={given!r}")
        if drop:
            options["last_batch"] = "drop"
    if options.get("last_batch", "") is None:  # None used to mean "the default"
        options.pop("last_batch")


def _unknown_message(unknown: list[str]) -> str:
    known = list(OPTION_GROUPS)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown Loader option(s) {', '.join(hints)}; the options are {', '.join(known)}"
