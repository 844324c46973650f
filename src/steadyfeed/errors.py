"""Errors that steadyfeed raises in the consumer.

Every per-sample failure is a :class:`SampleError` that names the sample id, the
file it came from (when the source can say), the epoch, the batch and how many
attempts were made, with the worker's traceback text attached and the original
exception chained as ``__cause__``.
"""

from __future__ import annotations

import errno
import functools


class SteadyfeedError(Exception):
    """Base class of every error steadyfeed raises on purpose."""


class DataError(SteadyfeedError, ValueError):
    """Input data is not what was expected: a missing or malformed file, unpaired names,
    a corrupt record. The message names the file (and row or record) and what was expected."""


class CollateError(DataError):
    """Samples of one batch that each read fine cannot be put in one batch: their keys,
    shapes or dtypes disagree (``Loader(collate=...)`` says how batches are made).

    Not a :class:`SampleError`: no single sample is at fault, so it is raised under any
    ``on_error`` and nothing is quarantined. ``sample_ids`` and ``locations`` name the
    first sample of the batch and the one that differs from it, ``found`` what each has
    (e.g. ``"shape (24, 32, 3) uint8"``), ``key`` the key (None when the keys differ)."""

    def __init__(
        self,
        message: str,
        *,
        epoch: int,
        batch_index: int,
        key: str | None,
        sample_ids: tuple[int, ...],
        locations: tuple[str | None, ...],
        found: tuple[str, ...],
        collate: str,
    ):
        super().__init__(message)
        self.epoch, self.batch_index, self.key = epoch, batch_index, key
        self.sample_ids, self.locations, self.found, self.collate = sample_ids, locations, found, collate

    def __reduce__(self):  # keep the fields when pickled
        return (_rebuild, (type(self), self.args[0], self.__dict__.copy()))


class SampleError(SteadyfeedError):
    """A sample could not be read or transformed (after all its attempts).

    Fields: ``sample_id``, ``epoch``, ``batch_index``, ``attempts``, ``error_type`` (the name of
    what the worker raised), ``location`` (where the sample lives, when the source can say),
    ``worker_traceback`` (text); the original exception is ``__cause__``. Raised by the
    loader, it is also an instance of the original exception's type (its class is
    ``SampleError[ValueError]`` for a ``ValueError``, where the two types combine), so
    ``except ValueError`` catches it."""

    def __init__(
        self,
        message: str,
        *,
        sample_id: int,
        epoch: int,
        batch_index: int,
        attempts: int,
        error_type: str = "",
        location: str | None = None,
        worker_traceback: str = "",
    ):
        super().__init__(message)
        self.sample_id = sample_id
        self.epoch = epoch
        self.batch_index = batch_index
        self.attempts = attempts
        self.error_type = error_type
        self.location = location
        self.worker_traceback = worker_traceback

    def __reduce__(self):  # keep the fields when pickled (e.g. re-raised from a subprocess)
        return (_rebuild, (type(self), self.args[0], self.__dict__.copy()))


def _rebuild(cls, message, fields):
    err = cls.__new__(cls)
    SteadyfeedError.__init__(err, message)
    err.__dict__.update(fields)
    return err


# Raised in a worker, they would end a generator or an interpreter: never a base of ours.
_NOT_MIXED = (StopIteration, StopAsyncIteration)


@functools.lru_cache(maxsize=256)
def with_original_type(cls: type, original: type) -> type:
    """``cls`` (a SampleError class) that is also an ``original`` (the worker's exception type),
    so ``except ValueError`` catches a ValueError a worker raised; ``cls`` itself when the two
    cannot be combined (a layout conflict, a constructor that needs other arguments)."""
    if not issubclass(original, Exception) or issubclass(original, _NOT_MIXED) or issubclass(cls, original):
        return cls
    namespace = {
        "__str__": Exception.__str__,
        "__module__": cls.__module__,  # the message, as SampleError's
        "__reduce__": lambda self: (_rebuild_mixed, (cls, original, self.args[0], self.__dict__.copy())),
    }
    try:
        mixed = type(f"{cls.__name__}[{original.__name__}]", (cls, original), namespace)
        mixed("probe", sample_id=0, epoch=0, batch_index=0, attempts=0)
    except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError takes exactly 5 arguments
        return cls
    return mixed


def _rebuild_mixed(cls, original, message, fields):
    return _rebuild(with_original_type(cls, original), message, fields)


class SampleTimeout(SampleError, TimeoutError):
    """A sample ran past the loader's ``timeout``."""


class WorkerDied(SampleError):
    """A worker process died (e.g. SIGKILL, segfault, out-of-memory kill) while on this sample."""


class TooManyErrors(SteadyfeedError):
    """More samples failed in one epoch than ``max_error_fraction`` allows."""


class NoSpace(SteadyfeedError, OSError):
    """A write found no room: ``needed`` bytes, with ``free`` bytes free of ``total`` where it was
    to go. An ``OSError`` with errno ``ENOSPC``, so ``except OSError`` catches it too; the message
    says where, how much, and what to do."""

    def __init__(self, message: str, needed: int = 0, free: int = 0, total: int = 0):
        super().__init__(errno.ENOSPC, message)
        self.needed, self.free, self.total = int(needed), int(free), int(total)

    def __str__(self) -> str:
        return self.strerror or ""

    def __reduce__(self):
        return (type(self), (self.strerror, self.needed, self.free, self.total))


class SharedMemoryFull(NoSpace):
    """Process mode's shared memory (``/dev/shm``) cannot hold what a worker needs. Seen when the
    memory is reserved, before any byte is written (never a bus error), and raised only where the
    loader may not fall back to pipes: ``transport="shm"``, or the one page each worker needs for
    its status."""


class DiskFull(NoSpace):
    """A file steadyfeed writes (a pack, a cache, an index, the quarantine report) does not fit
    on its filesystem: ``path`` names the file, ``needed`` the bytes it needed."""

    def __init__(self, message: str, needed: int = 0, free: int = 0, total: int = 0, path: str = ""):
        super().__init__(message, needed, free, total)
        self.filename = self.path = path

    def __reduce__(self):
        return (type(self), (self.strerror, self.needed, self.free, self.total, self.path))


class RayClusterLost(SteadyfeedError, RuntimeError):
    """The Ray cluster cannot run a loader's actors any more: it went away (``ray.shutdown()``,
    head node lost) or cannot start them (too few CPUs, nodes gone). ``address`` names the
    cluster."""

    def __init__(self, message: str, *, address: str | None = None):
        super().__init__(message)
        self.address = address


class RemoteError(Exception):
    """Stands in for a worker exception that could not be pickled back to the consumer."""
