"""File listings for folders of millions of files: compact, cached, shared with workers.

:class:`Listing` keeps the paths of a tree's files relative to its root in one packed
buffer (UTF-8 bytes, as the OS gives them) plus one int64 offset per file: a typical
``class/n01440764_10026.JPEG`` costs about 40 bytes, where a list of absolute path strings
costs 150 or more. Guarantees:

* **one pass, in order**: :func:`list_tree` lists each directory once with ``os.scandir``
  and visits entries sorted by name (a folder's name compared as ``name + "/"``), which is
  exactly the order of sorting the full paths, without ever holding all of them; names
  starting with "." are left out (unless ``hidden=True``), symlinks are followed, a real
  folder reached twice is listed once; a progress bar appears past 100,000 files;
* **cached, never trusted stale**: the listing is saved (``index_cache``, atomically) with
  the modification time and inode of every directory it read; it is reused only when all
  of them are unchanged (adding, removing or renaming any file or folder changes its
  directory's), else the tree is listed again. The cache lives beside the root, or in
  ``cache_dir``, or, where neither is writable, in the system's temporary directory;
* **shared, not copied**: pickled (to a spawned worker) a cached listing travels as its
  file's path and a build id, and each worker memory-maps that file (the page cache holds
  one copy for all processes; the consumer reads it into memory, so it holds no descriptor
  open). A worker that finds the file rebuilt since raises :class:`~steadyfeed.DataError`
  rather than read another order.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from ..progress import progress_bar
from . import index_cache

VERSION = 1
PROGRESS_AFTER = 100_000  # files listed before a progress bar appears
_SORT_CHUNK = 65_536  # names of one directory turned into a numpy array at a time (big flat folders)
_HEAD = 6  # payload words before the arrays: files, dirs, groups, buffer words, dir buffer words, build id


def _words(data: np.ndarray) -> np.ndarray:
    """uint8 bytes as int64 words (zero-padded), for an int64 index file."""
    padded = np.zeros(-(-len(data) // 8) * 8, np.uint8)
    padded[: len(data)] = data
    return padded.view(np.int64)


class Listing:
    """Paths relative to ``root`` (``relative(i)``, ``path(i)``), in groups (``group_starts``:
    group g holds files ``group_starts[g]:group_starts[g+1]``) and the directories read."""

    def __init__(
        self,
        root: str,
        buffer: np.ndarray,
        offsets: np.ndarray,
        group_starts: np.ndarray,
        dirs: tuple,
        cache_file: str | None = None,
        build_id: int = 0,
        stamp: tuple = (),
    ):
        self.root, self.buffer, self.offsets, self.group_starts = root, buffer, offsets, group_starts
        self.dirs = dirs  # (dir buffer, dir offsets, mtime_ns, inode): what the cache is checked against
        self.cache_file, self.build_id, self.stamp = cache_file, int(build_id), tuple(stamp)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def relative_bytes(self, i: int) -> bytes:
        return self.buffer[self.offsets[i] : self.offsets[i + 1]].tobytes()

    def relative(self, i: int) -> str:
        return os.fsdecode(self.relative_bytes(i))

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.relative(i))

    def relatives(self, ids: np.ndarray) -> list[str]:
        """``[self.relative(i) for i in ids]``, the offsets looked up at once (a batch's names)."""
        return [os.fsdecode(name) for name in self.relatives_bytes(ids)]

    def relatives_bytes(self, ids: np.ndarray) -> list[bytes]:
        """``[self.relative_bytes(i) for i in ids]``: names as the OS takes them, not decoded."""
        # a memoryview slices in a third of an array's time, and this runs for every name of a batch
        buffer, offsets = memoryview(self.buffer), self.offsets  # type: ignore[arg-type]
        starts, ends = offsets[ids].tolist(), offsets[np.add(ids, 1)].tolist()
        return [buffer[a:b].tobytes() for a, b in zip(starts, ends)]

    def paths(self, ids: np.ndarray) -> list[str]:
        """``[self.path(i) for i in ids]`` (a batch's files)."""
        prefix = os.path.join(self.root, "")
        return [prefix + name for name in self.relatives(ids)]

    def same_names(self, other: Listing) -> bool:
        return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.buffer, other.buffer)

    def nbytes(self) -> int:
        return int(self.buffer.nbytes + self.offsets.nbytes + self.group_starts.nbytes)

    # -- the cache file --------------------------------------------------------------------
    def payload(self) -> np.ndarray:
        dir_buffer, dir_offsets, mtimes, inodes = self.dirs
        head = np.array(
            [
                len(self),
                len(dir_offsets) - 1,
                len(self.group_starts) - 1,
                -(-len(self.buffer) // 8),
                -(-len(dir_buffer) // 8),
                self.build_id,
            ],
            np.int64,
        )
        return np.concatenate(
            [
                head,
                self.offsets,
                self.group_starts,
                dir_offsets,
                mtimes,
                inodes,
                _words(self.buffer),
                _words(dir_buffer),
            ]
        )

    @classmethod
    def from_payload(cls, root: str, payload: np.ndarray, cache_file: str, stamp: tuple) -> Listing | None:
        """The listing a cache payload holds, or None when it is malformed."""
        if len(payload) < _HEAD:
            return None
        files, dirs, groups, buffer_words, dir_words, build_id = (int(v) for v in payload[:_HEAD])
        sizes = [files + 1, groups + 1, dirs + 1, dirs, dirs, buffer_words, dir_words]
        if min(sizes) < 0 or _HEAD + sum(sizes) != len(payload):
            return None
        parts, at = [], _HEAD
        for size in sizes:
            parts.append(payload[at : at + size])
            at += size
        offsets, group_starts, dir_offsets, mtimes, inodes, buffer, dir_buffer = parts
        buffer, dir_buffer = buffer.view(np.uint8), dir_buffer.view(np.uint8)
        if offsets[-1] > len(buffer) or dir_offsets[-1] > len(dir_buffer) or group_starts[-1] != files:
            return None
        return cls(
            root,
            buffer[: offsets[-1]],
            offsets,
            group_starts,
            (dir_buffer[: dir_offsets[-1]], dir_offsets, mtimes, inodes),
            cache_file,
            build_id,
            stamp,
        )

    def unchanged(self) -> bool:
        """Whether every directory read still has the modification time and inode it had."""
        dir_buffer, dir_offsets, mtimes, inodes = self.dirs
        for k in range(len(mtimes)):
            relative = os.fsdecode(dir_buffer[dir_offsets[k] : dir_offsets[k + 1]].tobytes())
            try:
                st = os.stat(os.path.join(self.root, relative) if relative else self.root)
            except OSError:
                return False
            if (st.st_mtime_ns, st.st_ino) != (int(mtimes[k]), int(inodes[k])):
                return False
        return True

    # -- pickling: the cache file's name, not its contents --------------------------------
    def __getstate__(self) -> dict:
        if self.cache_file is not None:
            return {"root": self.root, "cache_file": self.cache_file, "build_id": self.build_id, "stamp": self.stamp}
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        if "buffer" in state:
            self.__dict__.update(state)
            return
        payload = index_cache.load(state["cache_file"], state["stamp"], mmap=True)
        listing = (
            None
            if payload is None
            else Listing.from_payload(state["root"], payload, state["cache_file"], state["stamp"])
        )
        if listing is None or listing.build_id != state["build_id"]:
            raise DataError(
                f"the file listing of {state['root']} at {state['cache_file']} was rebuilt or removed "
                "since this source was made (the tree changed?); make the source again"
            )
        self.__dict__.update(listing.__dict__)


class RelativePaths(Sequence):
    """A listing's paths as a read-only sequence of strings: absolute (``absolute=True``,
    ``ImageFolder.files``) or relative to the root (``NpyPairs.names``)."""

    def __init__(self, listing: Listing, absolute: bool):
        self._listing, self._absolute = listing, absolute

    def __len__(self) -> int:
        return len(self._listing)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} files")
        return self._listing.path(i) if self._absolute else self._listing.relative(i)

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        shown = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"[{shown}{', ...' if len(self) > 3 else ''}] ({len(self)} paths)"


# -- listing a tree ---------------------------------------------------------------------------
class _Builder:
    def __init__(self, root: str, progress: bool):
        self.root = root
        self.buffer, self.offsets = bytearray(), array("q", [0])
        self.dir_buffer, self.dir_offsets = bytearray(), array("q", [0])
        self.mtimes, self.inodes = array("q"), array("q")
        self._bar: Any = None  # a progress bar once the listing is long
        self._progress = progress

    def add_file(self, relative: bytes) -> None:
        self.buffer += relative
        self.offsets.append(len(self.buffer))
        if self._progress and len(self.offsets) % PROGRESS_AFTER == 0:
            if self._bar is None:
                self._bar = progress_bar(None, f"listing {self.root}", unit="files").__enter__()
                self._bar.update(len(self.offsets) - 1)
            else:
                self._bar.update(PROGRESS_AFTER)

    def add_dir(self, relative: bytes, st: os.stat_result) -> None:
        self.dir_buffer += relative
        self.dir_offsets.append(len(self.dir_buffer))
        self.mtimes.append(st.st_mtime_ns)
        self.inodes.append(st.st_ino)

    def listing(self, group_starts: list[int]) -> Listing:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        dirs = (
            np.frombuffer(bytes(self.dir_buffer), np.uint8),
            np.array(self.dir_offsets, np.int64),
            np.array(self.mtimes, np.int64),
            np.array(self.inodes, np.int64),
        )
        return Listing(
            self.root,
            np.frombuffer(bytes(self.buffer), np.uint8),
            np.array(self.offsets, np.int64),
            np.array(group_starts, np.int64),
            dirs,
            build_id=int.from_bytes(os.urandom(7), "little"),
        )


def _unlistable(path: str, exc: OSError) -> DataError:
    return DataError(f"cannot list {path}: {exc.strerror or exc}; expected a readable folder")


def _sorted_entries(path: str, hidden: bool) -> tuple[list[bytes], np.ndarray]:
    """The names in ``path`` (bytes) and whether each is a folder, in full-path sort order."""
    chunks, names, folder_flags = [], [], []
    try:
        with os.scandir(os.fsencode(path)) as entries:
            for entry in entries:
                if not hidden and entry.name.startswith(b"."):
                    continue
                is_dir = entry.is_dir()  # follows links; a broken link is a file that fails loudly on read
                names.append(entry.name + b"/" if is_dir else entry.name)
                folder_flags.append(is_dir)
                if len(names) == _SORT_CHUNK:
                    chunks.append(np.array(names, dtype=bytes))
                    names = []
    except OSError as exc:
        raise _unlistable(path, exc) from exc
    if names or not chunks:
        chunks.append(np.array(names, dtype=bytes))
    keys = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    flags = np.array(folder_flags, dtype=bool)
    order = np.argsort(keys, kind="stable")
    return [k[:-1] if f else k for k, f in zip(keys[order].tolist(), flags[order].tolist())], flags[order]


def _walk(
    builder: _Builder,
    path: str,
    relative: bytes,
    keep: Callable[[bytes], bool],
    recursive: bool,
    hidden: bool,
    seen: set,
) -> None:
    real = os.path.realpath(path)
    if real in seen:  # a link loop or a second link to the same folder
        return
    seen.add(real)
    try:
        builder.add_dir(relative, os.stat(path))
    except OSError as exc:
        raise _unlistable(path, exc) from exc
    names, folders = _sorted_entries(path, hidden)
    for name, is_dir in zip(names, folders.tolist()):
        child = relative + b"/" + name if relative else name
        if is_dir:
            if recursive:
                _walk(builder, os.path.join(path, os.fsdecode(name)), child, keep, recursive, hidden, seen)
        elif keep(name):
            builder.add_file(child)


def list_tree(
    root: str,
    groups: Sequence[str] = ("",),
    *,
    keep: Callable[[bytes], bool] = lambda name: True,
    recursive: bool = True,
    hidden: bool = False,
    progress: bool = True,
) -> Listing:
    """The files under each of ``root``'s sub-folders ``groups`` ("" for ``root`` itself), in
    order, that ``keep(name bytes)`` accepts; each group's real folders listed once."""
    builder = _Builder(root, progress)
    try:
        builder.add_dir(b"", os.stat(root))  # the root's own entries (a new group folder) count too
    except OSError as exc:
        raise _unlistable(root, exc) from exc
    starts = [0]
    for group in groups:
        top = os.path.join(root, group) if group else root
        _walk(builder, top, os.fsencode(group), keep, recursive, hidden, seen=set())
        starts.append(len(builder.offsets) - 1)
    return builder.listing(starts)


# -- cached listings --------------------------------------------------------------------------
def _stamp(root: str, kind: str, options: str) -> tuple:
    digest = int.from_bytes(hashlib.sha256(f"{kind}\0{options}".encode()).digest()[:7], "little")
    return index_cache.file_stamp(os.stat(root), VERSION, digest, len(kind))


def _targets(root: str, kind: str, cache_dir) -> list[str]:
    name = f"{root.rstrip(os.sep)}.{kind}-listing"
    places = [index_cache.cache_path(name, cache_dir)]
    if cache_dir is None:  # a read-only data folder: the system's temporary directory instead
        places.append(index_cache.cache_path(name, os.path.join(tempfile.gettempdir(), "steadyfeed-listings")))
    return places


def cached_listing(root: str, kind: str, options: str, build: Callable[[], Listing], *, cache_dir=None) -> Listing:
    """The listing of ``root`` from its cache when no directory it read has changed, else
    ``build()`` saved to the cache (memory-mapped back, so workers share the file).
    ``kind`` and ``options`` name what was listed (another filter is another listing)."""
    root = os.path.abspath(root)
    stamp = _stamp(root, kind, options)
    targets = _targets(root, kind, cache_dir)
    for target in targets:
        payload = index_cache.load(target, stamp)  # read, not mapped: a mapping would hold a descriptor open
        listing = None if payload is None else Listing.from_payload(root, payload, target, stamp)
        if listing is not None and listing.unchanged():
            return listing
    listing = build()
    failures = []
    for target in targets:
        try:
            index_cache.save(target, stamp, listing.payload())
        except OSError as exc:
            failures.append((target, exc))
            continue
        listing.cache_file, listing.stamp = target, stamp  # workers now map this file
        return listing
    index_cache.warn_unsaved(
        f"could not cache the file listing of {root}", failures[0][0], failures[0][1], stacklevel=3
    )
    return listing  # in memory only: it pickles whole (compact) to workers
