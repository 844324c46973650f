"""Writing files so that a reader never trusts a partial one.

Every file steadyfeed writes for later runs to read (caches, indexes, loader states, pack
manifests) goes through :func:`atomic_file`: the bytes go to a temporary file beside the
target, are flushed (and fsynced), and the temporary file is renamed over the target. A
reader sees the old file or the whole new one, never a torn one, also with concurrent
writers; a writer that fails or is interrupted removes its temporary file (a writer killed
outright leaves a hidden ``.<name>.*.tmp`` that no reader trusts). New files get the mode
the process's umask gives (``0o666 & ~umask``), as ``open()`` would, so another account
reading the data can read what steadyfeed wrote beside it; so do the directories that
:func:`staging_directory` makes for outputs published whole (``pack``).

A full filesystem (``ENOSPC``, or a quota: ``EDQUOT``) is a :class:`~steadyfeed.errors.DiskFull`
that names the file, the bytes it needed and those free (:func:`disk_full`, the one message),
and leaves nothing a later run would trust: :func:`atomic_file` reserves the bytes it is told
of before writing any (``size=``), and removes its temporary file whatever happens;
:func:`append_whole` adds a record to a file whole or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import IO

from .errors import DiskFull
from .units import exact_bytes, human_bytes

FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})  # no room, or over a quota


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def disk_full(path: str | os.PathLike, needed: int, *, what: str = "", how: str = "", then: str = "") -> DiskFull:
    """The error for a write of ``needed`` bytes to ``path`` that found no room. ``what``: what
    was being written, when that helps (``"the pack"``); ``how``: how ``needed`` was found,
    when it is an estimate; ``then``: what was done about it."""
    path = os.path.abspath(os.fspath(path))
    try:
        st = os.statvfs(os.path.dirname(path))
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        free = total = 0
    return DiskFull(
        f"no space left on the filesystem of {path}{f' for {what}' if what else ''}: it needs "
        f"{'about ' if how else ''}{exact_bytes(needed)}{f' ({how})' if how else ''} and "
        f"{human_bytes(free)} is free (of {human_bytes(total)}){f'; {then}' if then else ''}. Free "
        f"some space, or write to another filesystem",
        needed,
        free,
        total,
        path,
    )


def reserve(fd: int, size: int, path: str | os.PathLike) -> None:
    """Allocate ``size`` bytes of the file ``fd`` now (DiskFull naming ``path`` when they do not
    fit), so writing them later cannot run out of room. Where a filesystem cannot reserve
    (``EOPNOTSUPP``, no ``posix_fallocate`` on macOS), nothing happens."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in FULL:
            raise disk_full(path, size) from None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True, size: int | None = None) -> Iterator[IO[bytes]]:
    """``with atomic_file(path) as f: f.write(...)``: ``path`` appears whole when the block
    ends without an exception, and is left as it was otherwise. Creates the directory.
    ``size``: the bytes about to be written (or a bound), reserved before the first is written,
    so a full disk fails at once with DiskFull; without it, a full disk fails where it shows,
    with DiskFull all the same."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                reserve(fd, size or 0, path)
                yield f
                f.flush()
                if size:
                    f.truncate()  # the reservation may reach past what was written
                if fsync:
                    os.fsync(f.fileno())
            finally:
                written = _position(f)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if is_full(exc) and not isinstance(exc, DiskFull):
            raise disk_full(path, max(size or 0, written)) from exc
        raise


def _position(f: IO[bytes]) -> int:
    """How far the writes got (the buffered ones included), or 0 when the file cannot say."""
    try:
        return f.tell()
    except (OSError, ValueError):
        return 0


def atomic_write(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`), its bytes reserved first."""
    with atomic_file(path, fsync=fsync, size=len(data)) as f:
        f.write(data)


def append_whole(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to ``path`` (created if missing) whole or not at all: a write that fails
    part way (a full disk) is cut back off, so the file never ends in half a record. Assumes
    one writer appends at a time (a concurrent append could be cut too)."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # shrinking a file needs no room
            if is_full(exc):
                raise disk_full(path, len(data)) from exc
            raise
    finally:
        os.close(fd)


def staging_directory(target: str | os.PathLike) -> str:
    """A new, empty, hidden directory ``.<name>.partial-*`` beside ``target``, to fill and then
    rename to ``target``. Its mode is what the umask gives (``0o777 & ~umask``, as ``mkdir``
    makes it), not ``tempfile.mkdtemp``'s owner-only 0o700: a directory published by a rename
    keeps its mode, and another account (the training job) must be able to read it."""
    directory, name = os.path.split(os.path.abspath(os.fspath(target)))
    while True:
        path = os.path.join(directory, f".{name}.partial-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path)  # 0o777 & ~umask
            return path
        except FileExistsError:  # another writer's name, by a 1 in 4 billion chance: draw again
            continue


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
