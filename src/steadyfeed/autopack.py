"""Automatic packing: a small-file source turned into packed TFRecord shards while it is read.

``Loader(source, ..., pack_to=DIR)`` (why an option, not a wrapper source: the switch from
files to shards happens between epochs, where only the loader knows it stands, and it must
restart the workers on the new reader; a wrapper could only switch inside a worker, in the
middle of an epoch, and could not say in ``stats()`` what an epoch read). What it does:

* the pack of a source lives in ``DIR/<key>/``, ``key`` a digest of the source's type and
  ``fingerprint()`` (which changes when any file is added, removed or modified): a changed
  dataset gets a new pack, never a stale one; a source without ``fingerprint()`` is refused;
* when the loader's first epoch starts and no pack is there, a child process packs the source
  (``steadyfeed.pack``: every sample in id order, as the source returns it, before any
  transform) at the lowest priority, while the epoch is served from the files. The child
  (``pack_process.py``) takes none of the training process's GIL and ends with its loader;
  a source that cannot be pickled to it is packed by a thread instead
  (``stats()["pack"]["packer"]`` says which, and why). A source with ``encoded()`` and
  ``from_encoded(records)`` is packed in the form it gives: an ImageFolder packs its files'
  bytes, not their pixels (``sources/packed_images.py``), read back through the same decoder,
  and with ``pack_decoded`` a share of its images decoded too, beside the shards (what the
  form's ``add_to_pack`` writes inside ``pack``'s atomic directory, ``sources/decoded_pixels.py``);
* the pack appears whole or not at all: it is built in a hidden staging directory
  (``files.staging_directory``) holding the pack and ``source.json`` (the identity it was
  made from) and published by one rename, so a crash, a ``close()`` or a failing sample leave
  nothing that is ever read (a sample that fails to read abandons the pack: the loader goes on
  reading the files, and ``stats()["pack"]`` says why);
* every epoch that starts once the pack is published reads the shards (the workers are
  restarted once, on a ``TFRecordSource`` of the pack), and so do later runs from the first
  epoch on; an epoch never switches in its middle. When the shards fit in half the available
  memory they are handed to the kernel's readahead and read as they are opened (``prefetch``),
  so a shuffled epoch reads them sequentially once instead of one random read per sample;
* batches are bit-identical either way: a record round-trips its sample bit-exactly
  (``packing.py``), or its encoded form decoded as the source decodes it, and the transform,
  order and ids are the loader's own;
* ``stats()["reading"]`` is ``"files"`` or ``"pack"`` (what the current or last epoch read),
  ``stats()["pack"]`` the pack's state, and ``LoaderMonitor`` logs ``data_from_pack`` (the
  share of the epoch's batches read from the pack).

Costs: one more read of every sample during the first epoch (sequential, in id order, in
a process below the training loop's priority) and disk space for the samples as arrays
(for images, as much as the files, plus 48 KB for each 128 x 128 image held decoded). See
``docs/benchmarks.md`` (``bench_pack_to.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from .errors import DataError
from .files import atomic_write, fsync_directory, staging_directory
from .pack_process import Cancelled, NotPortable, PackFailed, Packing
from .sources.base import close_source, fingerprint, locate

PACK_NAME, IDENTITY_NAME = "pack", "source.json"
NICENESS = 19  # the lowest priority: the packer takes only cycles that the loop, its workers (and others) leave
JOIN_SECONDS = 30.0
PREFETCH_CHUNK = 128 * 1024  # the kernel's default readahead window (VM_READAHEAD_PAGES)


class _Reading:
    """The source as the packer reads it: stops at the next sample once cancelled, and leaves
    closing the source to the loader (``pack`` closes what it reads)."""

    def __init__(self, source: Any, stop: threading.Event):
        self.source, self.stop = source, stop

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        self._check()
        return self.source[i]

    def add_to_pack(self, directory: Path) -> None:
        """The source's own ``add_to_pack`` (``packing.pack`` calls it), stopped likewise."""
        add = getattr(self.source, "add_to_pack", None)
        if add is not None:
            add(directory, self._check)

    def _check(self) -> None:
        if self.stop.is_set():
            raise Cancelled("the loader was closed")

    def locate(self, i: int):
        return locate(self.source, i)

    def close(self) -> None:
        pass


def _cancelled(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, a cancellation (pack wraps what a read raises)."""
    while exc is not None:
        if isinstance(exc, Cancelled):
            return True
        exc = exc.__cause__
    return False


def pack_key(identity: dict) -> str:
    """The directory name of the pack of a source of this identity (type and fingerprint)."""
    return hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=16).hexdigest()


class AutoPack:
    """The pack of one source under ``root``: found, built in the background, or failed."""

    def __init__(self, root: str | os.PathLike, source: Any, decoded: float = 0.0):
        fp = fingerprint(source)
        if fp is None:
            raise ValueError(
                f"pack_to needs a source with fingerprint() (ImageFolder, NpyPairs, ...), so that a "
                f"changed dataset is never read from a stale pack; {type(source).__name__} has none"
            )
        from .sources.tfrecord import require_support

        require_support()  # ImportError now, naming the extra, not in the background later
        kind = type(source)
        # a source that says how to store itself (ImageFolder: its files' bytes) is packed so;
        # "stored" is in the identity, so a pack of another form is never read as this one
        self.encodes = callable(getattr(source, "encoded", None)) and callable(getattr(source, "from_encoded", None))
        if decoded and not self.encodes:
            raise ValueError(
                f"pack_decoded={decoded} stores decoded images beside their bytes, for a source packed in its "
                f"encoded form (ImageFolder); {kind.__name__} is packed as its samples already"
            )
        self.decoded = decoded
        self.identity = {
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "fingerprint": fp,
            **({"stored": getattr(self._encoded(source), "stored", "encoded")} if self.encodes else {}),
        }
        self.root, self.num_samples = Path(root), len(source)
        self.directory = self.root / pack_key(self.identity)
        self.error: str | None = None
        self.packer: str | None = None  # where the pack is built: "process", or "thread" and why
        self._child: Packing | None = None
        self._thread: threading.Thread | None = None
        self._prefetcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    # -- state -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """A complete pack of this very source is published."""
        try:
            with open(self.directory / IDENTITY_NAME, encoding="utf-8") as f:
                return json.load(f) == {"identity": self.identity, "samples": self.num_samples}
        except (OSError, ValueError):
            return False

    @property
    def state(self) -> str:
        if self.ready:
            return "ready"
        if self._thread is not None and self._thread.is_alive():
            return "building"
        return "failed" if self.error else "absent"

    def report(self) -> dict:
        return {
            "state": self.state,
            "path": str(self.directory / PACK_NAME),
            **({"decoded": self.decoded} if self.decoded else {}),  # pack_decoded
            **({"packer": self.packer} if self.packer else {}),
            **({"error": self.error} if self.error else {}),
        }

    def open(self, source: Any):
        """What the workers read once the pack is ready: a TFRecordSource of it, or for a source
        packed in its encoded form ``source.from_encoded(records)``. The files it reads are handed
        to the kernel's readahead and read when they fit in half the free memory (``prefetch``),
        by a thread of their own: that lasts as long as the disk takes to read them (a 10 GB
        pack, a minute on a slow disk), which the first batch need not wait for."""
        from .sources.tfrecord import TFRecordSource

        records = TFRecordSource(self.directory / PACK_NAME)
        if len(records) != self.num_samples:  # the identity file said otherwise: never trust it then
            raise DataError(f"{self.directory} holds {len(records)} records for {self.num_samples} samples")
        reader = source.from_encoded(records) if self.encodes else records
        # what an epoch reads (``data_files``: the shards, and an image pack's decoded share,
        # without the shards when it holds every image), the smallest first: a shuffled batch
        # needs some of each file, and the small ones are in soonest
        files = sorted(getattr(reader, "data_files", records.paths), key=_size_and_name)
        self._prefetcher = threading.Thread(
            target=prefetch, args=(files, self._stop), name="steadyfeed-prefetch", daemon=True
        )
        self._prefetcher.start()
        return reader

    # -- building --------------------------------------------------------------------------
    def start(self, source: Any) -> None:
        """Pack ``source`` in a background thread, unless a pack is ready, being built, or failed."""
        with self._lock:
            if self._thread is not None or self.error or self.ready:
                return
            self._thread = threading.Thread(target=self._build, args=(source,), name="steadyfeed-pack_to", daemon=True)
            self._thread.start()

    def _encoded(self, source: Any) -> Any:
        """What a source that says how to store itself is packed as (``pack_decoded``: a share of
        its images decoded too; a source's ``encoded()`` need not take that argument otherwise)."""
        return source.encoded(self.decoded) if self.decoded else source.encoded()

    def _build(self, source: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(staging_directory(self.directory))
        try:
            self._pack(self._encoded(source) if self.encodes else source, staging / PACK_NAME)
            atomic_write(
                staging / IDENTITY_NAME, json.dumps({"identity": self.identity, "samples": self.num_samples}).encode()
            )
            fsync_directory(staging)
            self._publish(staging)
        except BaseException as exc:  # a failing sample, a full disk, close(): no pack, the files go on
            shutil.rmtree(staging, ignore_errors=True)
            self.error = (
                None if _cancelled(exc) else str(exc) if isinstance(exc, PackFailed) else f"{type(exc).__name__}: {exc}"
            )

    def _pack(self, stored: Any, out: Path) -> None:
        """Pack ``stored`` into ``out`` in a child process (``pack_process.py``: a thread here
        would hold the GIL the training loop and the workers need), or in this thread when
        the source cannot go to one."""
        from .execution.workers import lower_priority
        from .packing import pack

        try:
            with self._lock:
                if self._stop.is_set():
                    raise Cancelled("the loader was closed")
                self._child = Packing(stored, out, NICENESS)
            self.packer = "process"
            self._child.wait()
            return
        except NotPortable as exc:
            self.packer = f"thread: {exc}"
        finally:
            with self._lock:
                self._child = None
        lower_priority(NICENESS)
        pack(_Reading(stored, self._stop), out, progress=False)

    def _publish(self, staging: Path) -> None:
        """One rename makes the pack appear. A stale or half-gone one of the same key (only a
        killed writer leaves one: publishing is a rename) is moved aside first; another run
        that published the same pack first wins, and this copy is dropped."""
        if self.directory.exists() and not self.ready:
            aside = Path(staging_directory(self.directory))
            os.replace(self.directory, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(staging, self.directory)
        except OSError:
            if not self.ready:
                raise
            shutil.rmtree(staging, ignore_errors=True)
        fsync_directory(self.root)

    def stop(self) -> None:
        """Cancel a build or a prefetch under way and wait for their threads (bounded)."""
        with self._lock:
            self._stop.set()
            child = self._child
        if child is not None:
            child.cancel()
        for thread in (self._thread, self._prefetcher):
            if thread is not None:
                thread.join(JOIN_SECONDS)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a build under way to end; whether a pack is ready."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.ready


def prefetch(paths: list[str] | list[Path], stop: threading.Event | None = None) -> bool:
    """Read ``paths`` into the page cache when they fit in half the memory available. This is
    what a pack has over small files: a shuffled epoch then reads memory, where a cold one pays
    a random disk read per sample. Whether it was done (Linux only); ``stop``, once set, ends it
    at the next window.

    Two passes a file: ``POSIX_FADV_WILLNEED`` for each window queues every read with the
    device at once, then one read of each window into a reused buffer waits for them and brings
    in what the advice did not: advice is free to drop a window (a CI machine kept 3% of a
    40 MB file on the disk for a minute), a read is not."""
    advise = getattr(os, "posix_fadvise", None)
    total = sum(os.path.getsize(p) for p in paths)
    if advise is None or not total or total > available_memory() // 2:
        return False
    window = bytearray(PREFETCH_CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if not (_advise_windows(f.fileno(), size, advise, stop) and _read_windows(f, window, stop)):
                break  # stopped
    return True


def _advise_windows(fd: int, size: int, advise: Any, stop: threading.Event | None) -> bool:
    """``WILLNEED`` one window at a time (False once ``stop`` is set): Linux reads at most the
    device's readahead window per call (read_ahead_kb: 8 MB on one VM's disk, 128 KB by
    default), so one call for a whole 34 MB shard left three quarters of it on the disk."""
    try:
        for offset in range(0, size, PREFETCH_CHUNK):
            if stop is not None and stop.is_set():
                return False
            advise(fd, offset, PREFETCH_CHUNK, os.POSIX_FADV_WILLNEED)
    except OSError:  # advice only: a file system may decline it, and the reads still come
        pass
    return True


def _read_windows(f: Any, window: bytearray, stop: threading.Event | None) -> bool:
    """Read ``f`` to its end a window at a time into ``window`` (False once ``stop`` is set)."""
    while not (stop is not None and stop.is_set()):
        if not f.readinto(window):
            return True
    return False


def _size_and_name(path: str | os.PathLike[str]) -> tuple[int, str]:
    return os.path.getsize(path), os.fspath(path)


def available_memory() -> int:
    """Bytes of memory available without swapping (``MemAvailable``; 0 where unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def close_reader(reader: Any, source: Any) -> None:
    """Close what the loader read besides its own source (the pack's TFRecordSource)."""
    if reader is not None and reader is not source:
        close_source(reader)
