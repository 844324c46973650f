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
"""
from __future__ import annotations

import contextlib
import os
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[IO[bytes]]:
    """``with atomic_file(path) as f: f.write(...)``: ``path`` appears whole when the block
    ends without an exception, and is left as it was otherwise. Creates the directory."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path, fsync=fsync) as f:
        f.write(data)


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
