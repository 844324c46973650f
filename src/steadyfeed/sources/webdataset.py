"""WebDatasetSource: random access to the samples of tar shards in the WebDataset layout.

A shard is a plain tar file whose members are ``<key>.<ext>`` (``images/0001.jpg``,
``images/0001.cls``, ...): consecutive members with the same key are one sample, whose keys
are the extensions (everything after the first dot of the file name, lower-cased), as the
``webdataset`` library groups them. Shards written by its ``TarWriter``, by Python's
``tarfile`` or by the ``tar`` command read alike. Values are the members' bytes, as stored:
decode them in a transform (``decode_image`` for image members, ``int(v)`` for a ``.cls``).

Random access: one pass over a shard's tar headers (Python's ``tarfile``; no member data
is read) finds where each member's bytes lie; the result is cached as ``<shard>.sfidx.npy``
beside it, or in ``cache_dir``, stamped with the shard's size and mtime and rebuilt when
they change (:mod:`.index_cache`). Reading a sample is one ``pread`` per member, on
per-process handles, so threads share the source and it pickles without handles.

Guarantees: sample ``i`` is the ``i``-th sample across the shards in sorted order; a
sample that lacks a requested key, or holds one twice, raises :class:`DataError` naming the
shard, the sample's key and byte offset; a shard whose tar stream breaks (a corrupt header,
a member cut short, garbage after the last member) reads every sample before the break,
and the break is one more sample whose read raises a DataError naming the shard and byte
(raised by the loader, or quarantined under ``on_error="skip"``). Member sizes come from
headers that are checked against the shard's size first, so a hostile header allocates
nothing. Compressed shards (``.tar.gz``) have no random access: decompress them first.
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import os
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from . import index_cache
from .base import LazyHandles, file_fingerprint

INDEX_VERSION = 1
BLOCK = 512  # tar's block size
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's rule: the key ends at the first dot of the name
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")
_SCAN_BYTES = 1 << 20


def shard_files(shards) -> list[str]:
    """The shards ``shards`` names, sorted: a file, a glob, a brace range (``shard-{000..009}.tar``,
    as webdataset writes them), a directory (its ``.tar`` files) or a list of those."""
    if not isinstance(shards, (str, os.PathLike)):
        files = sorted({f for s in shards for f in shard_files(s)})
        if not files:
            raise DataError("WebDatasetSource got an empty list of shards: expected at least one tar file")
        return files
    pattern = os.path.expanduser(os.fspath(shards))
    if os.path.isdir(pattern):
        files = sorted(os.path.join(pattern, f) for f in os.listdir(pattern) if f.endswith(".tar"))
        if not files:
            raise DataError(f"{pattern} holds no .tar shards")
        return files
    expanded = _expand_braces(pattern)
    if len(expanded) > 1 or glob.has_magic(pattern):
        files = sorted({f for p in expanded for f in (glob.glob(p) if glob.has_magic(p) else [p])})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"tar shard not found: {missing[0]} ({len(missing)} of {len(files)} missing)")
        if not files:
            raise DataError(f"no files match {pattern!r}: expected tar shards")
        return files
    if not os.path.isfile(pattern):
        raise FileNotFoundError(f"tar shard not found: {pattern}")
    return [pattern]


def _expand_braces(pattern: str) -> list[str]:
    """``a{00..02}b`` as ``a00b, a01b, a02b`` (zero-padded as the first bound is written)."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    lo, hi = match.group(1), match.group(2)
    width = len(lo)
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [f"{head}{n:0{width}d}{rest}" for n in range(int(lo), int(hi) + 1) for rest in _expand_braces(tail)]


# -- one shard's index -------------------------------------------------------------------------------
@dataclass
class _Shard:
    """The regular members of one shard (name, data offset, size), in order, and the byte where
    its tar stream breaks (None: it does not)."""

    path: str
    names: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    broken: int | None = None
    samples: list = field(default_factory=list)  # (key, first member, member count), built by _group

    def payload(self) -> np.ndarray:
        """The index as int64 words: ``n, name bytes, broken | offsets | sizes | name ends | names``."""
        encoded = [n.encode("utf-8", "surrogateescape") for n in self.names]
        blob = b"".join(encoded)
        ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        words = np.frombuffer(blob + b"\0" * (-len(blob) % 8), np.int64)
        head = [len(self.names), len(blob), -1 if self.broken is None else self.broken]
        return np.concatenate([np.array(head, np.int64), self.offsets, self.sizes, ends, words])

    @classmethod
    def from_payload(cls, path: str, a: np.ndarray, size: int) -> _Shard | None:
        if a.ndim != 1 or len(a) < 3:
            return None
        n, nbytes, broken = (int(v) for v in a[:3])
        if n < 0 or nbytes < 0 or len(a) != 3 + 3 * n + -(-nbytes // 8):
            return None
        offsets, sizes, ends = a[3 : 3 + n], a[3 + n : 3 + 2 * n], a[3 + 2 * n : 3 + 3 * n]
        if n and (
            (sizes < 0).any()
            or (offsets < 0).any()
            or (offsets + sizes > size).any()
            or ends[-1] != nbytes
            or (np.diff(ends) < 0).any()
        ):
            return None
        blob = a[3 + 3 * n :].tobytes()[:nbytes]
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        names = [blob[s:e].decode("utf-8", "surrogateescape") for s, e in zip(starts.tolist(), ends.tolist())]
        return cls(path, names, offsets.copy(), sizes.copy(), None if broken < 0 else broken)


def _scan_shard(path: str) -> _Shard:
    """The regular members of a plain tar file, from its headers (tarfile reads no member data)."""
    names, offsets, sizes, broken = [], [], [], None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(2) == b"\x1f\x8b":
            raise DataError(
                f"{path} is gzip-compressed: a tar shard needs no compression for random access; "
                f"decompress it first (gunzip)"
            )
        f.seek(0)
        end = 0  # where the bytes after the last good member start
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for info in tar:
                    if info.offset_data + info.size > size:
                        broken = info.offset
                        break
                    end = info.offset_data + -(-info.size // BLOCK) * BLOCK
                    if info.isreg():
                        names.append(info.name)
                        offsets.append(info.offset_data)
                        sizes.append(info.size)
        except tarfile.TarError:
            broken = end
        if broken is None and not _zeros_from(f, end, size):  # tarfile stops quietly at a bad header
            broken = end
    return _Shard(path, names, np.array(offsets, np.int64), np.array(sizes, np.int64), broken)


def _zeros_from(f, start: int, size: int) -> bool:
    """Whether every byte from ``start`` to the end is zero (tar's end-of-archive blocks)."""
    f.seek(start)
    while chunk := f.read(_SCAN_BYTES):
        if chunk.count(0) != len(chunk):
            return False
    return True


def _break_reason(fd: int, size: int, offset: int) -> str:
    """Why the tar stream cannot be read at ``offset``: the first of the headers from there on
    (an extended header is followed by the one it extends) that ``TarInfo.frombuf`` refuses, or
    whose member runs past the end of the shard."""
    pos = offset
    for _ in range(4):
        header = os.pread(fd, BLOCK, pos)
        if len(header) < BLOCK:
            return f"the shard ends inside the tar header at byte {pos} ({len(header)} of {BLOCK} bytes)"
        if header.count(0) == BLOCK:
            return f"bytes that are not zeros follow tar's end-of-archive marker at byte {pos}"
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            return f"no valid tar header at byte {pos} ({exc})"
        left = size - pos - BLOCK
        if info.size > left:
            return f"member {info.name!r} at byte {pos} declares {info.size} bytes but only {max(left, 0)} remain"
        pos += BLOCK + -(-info.size // BLOCK) * BLOCK
    return f"the bytes from byte {offset} on are neither a member nor tar's end-of-archive zeros"


def _load_shard(path: str, cache_dir) -> _Shard:
    st = os.stat(path)
    target = index_cache.cache_path(path, cache_dir)
    stamp = index_cache.file_stamp(st, INDEX_VERSION)
    cached = index_cache.load(target, stamp)
    shard = None if cached is None else _Shard.from_payload(path, cached, st.st_size)
    if shard is None:
        shard = _scan_shard(path)
        try:
            index_cache.save(target, stamp, shard.payload())
        except OSError as exc:
            index_cache.warn_unsaved(
                f"WebDatasetSource could not cache the member index of {path}", target, exc, stacklevel=4
            )
    _group(shard)
    return shard


def _group(shard: _Shard) -> None:
    """Consecutive members with the same key are one sample (members without an extension are
    not part of any, as in webdataset)."""
    samples: list[tuple[str, int, int]] = []
    for m, name in enumerate(shard.names):
        match = _KEY_EXT.match(name)
        if match is None:
            continue
        key = match.group(1)
        if samples and samples[-1][0] == key and sum(samples[-1][1:]) == m:
            samples[-1] = (key, samples[-1][1], samples[-1][2] + 1)
        else:
            samples.append((key, m, 1))
    shard.samples = samples


def _ext(name: str) -> str:
    match = _KEY_EXT.match(name)
    assert match is not None  # a member of a sample: its name matched in _group
    return match.group(2).lower()


class WebDatasetSource:
    """Samples of WebDataset tar shards (see the module docstring for the layout and guarantees).

    ``WebDatasetSource(shards, keys=None, *, cache_dir=None)``

    ``shards``: a file, glob, brace range (``"data/shard-{000..099}.tar"``), directory, or a
    list. ``keys``: None gives every member of a sample, keyed by extension; a list of
    extensions (``["jpg", "cls"]``) or a dict ``{key: extension}`` selects members and
    requires them (``"jpg;png"``: the first of these that the sample has).
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        keys: dict[str, str] | Iterable[str] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.paths = shard_files(shards)
        self._shards = [_load_shard(path, cache_dir) for path in self.paths]
        for shard in self._shards:
            if not shard.samples and shard.broken is not None:  # nothing to read: no tar shard
                with open(shard.path, "rb", buffering=0) as f:
                    raise self._break_error(shard, f.fileno())
        if keys is None:
            self.keys = None
        else:
            items = keys.items() if isinstance(keys, dict) else ((k, k) for k in keys)
            self.keys = {str(k): tuple(e.lower() for e in str(exts).split(";")) for k, exts in items}
        self._ends = np.cumsum([len(s.samples) + (s.broken is not None) for s in self._shards]).tolist()
        self._handles = LazyHandles(_open_readonly, os.close)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _where(self, i: int) -> tuple[_Shard, int]:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample id {i} out of range for WebDatasetSource of length {len(self)}")
        s = bisect.bisect_right(self._ends, i)
        return self._shards[s], i - (self._ends[s - 1] if s else 0)

    def locate(self, i: int) -> str:
        shard, k = self._where(i)
        if k == len(shard.samples):
            return f"{shard.path} at byte {shard.broken}"
        key, first, _ = shard.samples[k]
        return f"{shard.path} sample {key!r} (data from byte {int(shard.offsets[first])})"

    def members(self, i: int) -> dict[str, tuple[int, int]]:
        """Sample ``i``'s members: extension -> (data offset, size) in its shard."""
        shard, k = self._where(i)
        if k == len(shard.samples):
            with self._handles.use(shard.path) as fd:
                raise self._break_error(shard, fd)
        key, first, count = shard.samples[k]
        found: dict[str, tuple[int, int]] = {}
        for m in range(first, first + count):
            ext = _ext(shard.names[m])
            if ext in found:
                raise DataError(
                    f"{self.locate(i)}: the sample holds {ext!r} twice ({shard.names[m]!r} again, data at "
                    f"byte {int(shard.offsets[m])}); expected one member per extension"
                )
            found[ext] = (int(shard.offsets[m]), int(shard.sizes[m]))
        return found

    def __getitem__(self, i: int) -> dict:
        shard, _ = self._where(i)
        members = self.members(i)
        if self.keys is None:
            chosen = {ext: ext for ext in members}
        else:
            chosen = {key: self._pick(i, members, exts) for key, exts in self.keys.items()}
        with self._handles.use(shard.path) as fd:
            return {key: self._read(i, fd, ext, *members[ext]) for key, ext in chosen.items()}

    def _pick(self, i: int, members: dict, exts: tuple) -> str:
        for ext in exts:
            if ext in members:
                return ext
        raise DataError(
            f"{self.locate(i)}: expected a member {' or '.join(repr(e) for e in exts)}, the sample has "
            f"{sorted(members)}"
        )

    def _read(self, i: int, fd: int, ext: str, offset: int, size: int) -> bytes:
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise DataError(
                f"{self.locate(i)}: member {ext!r} at byte {offset} is truncated: expected {size} bytes, "
                f"found {len(data)} (did the shard change after it was indexed?)"
            )
        return data

    def _break_error(self, shard: _Shard, fd: int) -> DataError:
        assert shard.broken is not None  # only for a shard whose tar stream breaks
        reason = _break_reason(fd, os.fstat(fd).st_size, shard.broken)
        before = (
            f"the {len(shard.samples)} sample(s) before it read"
            if shard.samples
            else "no sample before it (is it a tar file?)"
        )
        return DataError(f"{shard.path}: the tar stream breaks at byte {shard.broken}: {reason}; {before}")

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        return [self[i] for i in ids]

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{file_fingerprint(self.paths)}\0{self.keys!r}".encode()).hexdigest()

    def close(self) -> None:
        self._handles.close()

    def __repr__(self) -> str:
        keys = "every member" if self.keys is None else ", ".join(f"{k}={'/'.join(v)}" for k, v in self.keys.items())
        return f"WebDatasetSource({len(self)} samples in {len(self.paths)} shard(s); {keys})"


def _open_readonly(path: str) -> int:
    return os.open(path, os.O_RDONLY)
