"""Sources over ``.npy`` files, read without ``np.load`` and never unpickling anything.

* :class:`NpyPairs`: one file per sample, ``inputs/NAME.npy`` paired with ``labels/NAME.npy``.
* :class:`NpyArray`: rows of large ``.npy`` files, memory-mapped read-only in each process.

Both read every header with numpy's own ``np.lib.format`` helpers and check it against
the file's size before allocating anything, so a truncated or hostile file is a
:class:`~steadyfeed.DataError` naming the file and the sizes, never a huge allocation.
Object (pickled) arrays are refused, as ``np.load(..., allow_pickle=False)`` does.
"""

from __future__ import annotations

import errno
import functools
import io
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import DataError
from .base import Allocator, LazyHandles, MappedFile, file_fingerprint, native, numpy_allocator, pread_fully
from .listing import Listing, RelativePaths, cached_listing, list_tree
from .raw_rows import GAP_BYTES, RawRows, read_rows

_FIRST_READ = 256  # np.save pads headers to 64 bytes: 128 for ordinary dtypes and shapes
_LENGTH_FIELD = {(1, 0): "<H", (2, 0): "<I"}  # how each version stores its header length
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
_SHOWN = 10  # names listed in an unpaired-files error
_OPENAT = os.open in os.supports_dir_fd  # files opened relative to an open directory (not on Windows)


@dataclass(frozen=True)
class _Layout:
    """Where and how the array of a .npy file lies: everything its header says."""

    dtype: np.dtype
    shape: tuple
    order: Literal["C", "F"]
    offset: int  # first data byte
    nbytes: int
    header: bytes  # the header itself (magic to padding), for byte-for-byte comparison


@functools.lru_cache(maxsize=1024)
def _parse_header(header: bytes) -> _Layout:
    """The layout a header describes. Cached by the header's bytes: files whose headers are
    byte-identical (same dtype and shape) are parsed once per process, which is most of the
    saving over ``np.load``."""
    fp = io.BytesIO(header)
    version = np.lib.format.read_magic(fp)
    shape, fortran, dtype = _HEADER_READERS[version](fp)
    return _Layout(dtype, shape, "F" if fortran else "C", len(header), math.prod(shape) * dtype.itemsize, header)


def _header(fd: int, size: int) -> bytes:
    """The header bytes (magic to padding), read with pread only after checking they fit in the file."""
    head = os.pread(fd, _FIRST_READ, 0)
    version = np.lib.format.read_magic(io.BytesIO(head))  # ValueError unless the magic string is right
    if version not in _LENGTH_FIELD:
        raise ValueError(f"format version {version[0]}.{version[1]} is not supported (only 1.0 and 2.0)")
    field = _LENGTH_FIELD[version]
    start = np.lib.format.MAGIC_LEN + struct.calcsize(field)
    if len(head) < start:
        raise ValueError(f"the header length field is cut off ({size} bytes in all)")
    end = start + struct.unpack_from(field, head, np.lib.format.MAGIC_LEN)[0]
    if end > size:
        raise ValueError(f"the header claims {end} bytes but the file has {size}")
    return head[:end] if end <= len(head) else head + os.pread(fd, end - len(head), len(head))


def npy_layout(fd: int, path: str) -> _Layout:
    """The checked layout of the open .npy file ``path``: readable without pickles and exactly
    as long as its header says."""
    size = os.fstat(fd).st_size
    try:
        layout = _parse_header(_header(fd, size))
    except ValueError as exc:
        raise DataError(f"{path}: not a readable .npy file: {exc}") from None
    if layout.dtype.hasobject:
        raise DataError(
            f"{path}: holds Python objects (dtype {layout.dtype}), which .npy stores as a pickle; "
            "steadyfeed never loads pickles (allow_pickle=False): save a numeric array instead"
        )
    expected = layout.offset + layout.nbytes
    if size != expected:
        raise DataError(
            f"{path}: {'truncated' if size < expected else 'trailing bytes'}: expected {expected} bytes "
            f"(header {layout.offset} + {layout.dtype} {layout.shape} data {layout.nbytes}), file has {size}"
        )
    return layout


def _read_into(fd: int, out: np.ndarray, offset: int, path: str) -> None:
    """Fill ``out`` with the file's bytes from ``offset``."""
    missing = pread_fully(
        fd,
        memoryview(out.reshape(-1, order="A").view(np.uint8)),  # type: ignore[arg-type]
        offset,
    )  # numpy's stubs give ndarray a __buffer__ on Python >= 3.12 only
    if missing:
        raise DataError(
            f"{path}: file shrank while being read ({missing} bytes missing at offset {offset + out.nbytes - missing})"
        )


class _Folder(NamedTuple):
    """Files of one directory, opened relative to it: the kernel walks one path component per
    open, not the whole path (a ``.npy`` pair: 0.4 us of 19 less in one process), and nothing
    decodes or encodes a name. Messages name the full path. ``fd`` is None where ``os.open``
    takes no ``dir_fd`` (Windows): names are then joined to ``prefix``."""

    path: str
    fd: int | None
    prefix: bytes  # the directory's path and a separator, as bytes

    def open(self, name: bytes) -> int:
        try:
            if self.fd is None:
                return os.open(self.prefix + name, os.O_RDONLY)
            return os.open(name, os.O_RDONLY, dir_fd=self.fd)
        except OSError as exc:
            raise self.error(exc, name) from None

    def error(self, exc: OSError, name: bytes) -> OSError:
        """``exc`` as it names file ``name``: the full path, as the user knows the file, not a
        name relative to a descriptor."""
        return OSError(exc.errno, exc.strerror, self.path_of(name))

    def path_of(self, name: bytes) -> str:
        return os.path.join(self.path, os.fsdecode(name))

    def layout(self, name: bytes, last: _Layout | None) -> _Layout:
        """The layout of file ``name``, which must be one a whole batch can share (not
        Fortran-ordered with more than one dimension: ValueError, read one by one).

        ``last`` is the layout the previous batch's first file had: where this file's header
        holds the same bytes, it is that layout, and nothing is parsed (its length is checked
        as its row is read, ``_read_stack``); otherwise the header is read and checked."""
        fd = self.open(name)
        try:
            if last is not None and os.pread(fd, last.offset, 0) == last.header:
                return last
            layout = npy_layout(fd, self.path_of(name))
        finally:
            os.close(fd)
        if layout.order == "F" and len(layout.shape) > 1:
            raise ValueError(f"{self.path_of(name)}: Fortran order: read one by one")
        return layout


def _open_folders(paths: tuple[str, ...]) -> tuple[int | None, ...]:
    if not _OPENAT:
        return (None,) * len(paths)
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)))
    except BaseException:
        _close_folders(tuple(fds))
        raise
    return tuple(fds)


def _close_folders(fds: tuple[int | None, ...]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _read_stack(folder: _Folder, names: list[bytes], first: _Layout, out: np.ndarray) -> np.ndarray:
    """The arrays of files ``names``, which must share ``first`` (the checked layout of the
    first), as the rows of ``out`` (rows of that shape and dtype).

    Each file is read whole in one ``preadv``: its header into a scratch buffer, its data
    straight into its row, plus one byte past the end. A file whose header is byte-identical
    to ``first``'s and whose length is exact is done: no parsing, no ``fstat``, three system
    calls. Anything else (another shape or dtype, a truncated or overlong file) takes the
    checked path, which names the problem (ValueError for a file that cannot share the rows).
    """
    if first.nbytes == 0:  # rows of nothing: each file's header checked, no data
        for row, name in enumerate(names):
            _read_file_checked(folder, name, out, row, first)
        return out
    # rows as slices of one memoryview: a third of a numpy row view's cost, paid for every file
    flat = memoryview(out.reshape(len(names), -1).view(np.uint8)).cast("B")  # type: ignore[arg-type]
    scratch, past_end = bytearray(first.offset), bytearray(1)
    size, width, header = first.offset + first.nbytes, first.nbytes, first.header
    # the system calls bound once and made here, not through folder.open: 0.6 us less a pair of
    # files, of 15.6 (2 processes reading npy pairs spend nearly all their time in this loop)
    open_file, preadv, close, flags = os.open, os.preadv, os.close, os.O_RDONLY
    dir_fd, prefix = folder.fd, folder.prefix
    at = 0
    for name in names:
        try:
            fd = open_file(name, flags, dir_fd=dir_fd) if dir_fd is not None else open_file(prefix + name, flags)
        except OSError as exc:
            raise folder.error(exc, name) from None
        try:
            if preadv(fd, [scratch, flat[at : at + width], past_end], 0) != size or scratch != header:
                _read_row_checked(fd, folder.path_of(name), out, at // width, first)
        finally:
            close(fd)
        at += width
    return out


def _read_file_checked(folder: _Folder, name: bytes, out: np.ndarray, row: int, first: _Layout) -> None:
    fd = folder.open(name)
    try:
        _read_row_checked(fd, folder.path_of(name), out, row, first)
    finally:
        os.close(fd)


def _read_row_checked(fd: int, path: str, out: np.ndarray, row: int, first: _Layout) -> None:
    layout = npy_layout(fd, path)
    if (layout.shape, native(layout.dtype), layout.order) != (first.shape, native(first.dtype), first.order):
        raise ValueError(f"{path}: {layout.dtype} {layout.shape} differs from {first.dtype} {first.shape}")
    if not layout.nbytes:
        return
    if layout.dtype == first.dtype:
        _read_into(fd, out[row : row + 1], layout.offset, path)
    else:  # the same values in the other byte order (one big-endian file among native ones)
        other = np.empty((1, *layout.shape), layout.dtype)
        _read_into(fd, other, layout.offset, path)
        out[row : row + 1] = other


def read_npy(path: str) -> np.ndarray:
    """The array in ``path``, bit-identical to ``np.load(path, allow_pickle=False)`` (dtype, byte
    order, shape, memory order) and freshly allocated. Raises DataError naming the file for a
    malformed, truncated or object (pickled) file. Safe to call from many threads at once."""
    fd = os.open(path, os.O_RDONLY)
    try:
        layout = npy_layout(fd, path)
        out = np.empty(layout.shape, layout.dtype, order=layout.order)
        if layout.nbytes:
            _read_into(fd, out, layout.offset, path)
        return out
    finally:
        os.close(fd)


def _is_npy(name: bytes) -> bool:
    return name.endswith(b".npy")


def _npy_listing(directory: str, role: str, cache_dir) -> Listing:
    """The ``*.npy`` names in ``directory`` (not folders; broken symlinks kept, so they fail
    loudly on read, never vanish), sorted, compact and cached (``listing.py``)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, f"NpyPairs {role} directory not found", directory)
    listing = cached_listing(
        directory,
        "npy",
        "",
        cache_dir=cache_dir,
        build=lambda: list_tree(directory, keep=_is_npy, recursive=False, hidden=True),
    )
    if not len(listing):
        raise DataError(f"NpyPairs {role} directory {directory} has no .npy files")
    return listing


def _unpaired(side: set[str], other: set[str], directory: str, other_dir: str) -> str:
    lonely = sorted(side - other)
    shown = ", ".join(lonely[:_SHOWN]) + (", ..." if len(lonely) > _SHOWN else "")
    return f"{len(lonely)} file(s) in {directory} have no match in {other_dir}: {shown}" if lonely else ""


class NpyPairs:
    """Sample ``i`` is ``{"x": inputs_dir/NAME.npy, "y": labels_dir/NAME.npy}`` for the i-th NAME
    in sorted order; both directories must hold exactly the same ``*.npy`` names.

    Construction lists the directories only (no file is opened): a missing directory is
    FileNotFoundError, an empty one or unpaired names a DataError listing them. The names
    are kept compactly and cached beside each directory (``listing.py``: ~40 bytes a file,
    reused until a directory changes, shared with process workers as a mapped file, so 10
    million pairs pickle small). Each read parses the header (cached per distinct header)
    and preads the data straight into a fresh array; a bad file is a DataError naming it,
    pinned on its sample by the loader. A batch's files are opened relative to their
    directories, which each process opens on its first batch and keeps until ``close()``
    (two descriptors, never one per file); safe to share between threads.
    """

    def __init__(
        self,
        inputs_dir: str | os.PathLike[str],
        labels_dir: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.dirs = {"x": os.fspath(inputs_dir), "y": os.fspath(labels_dir)}
        self._prefixes = {key: os.fsencode(os.path.join(d, "")) for key, d in self.dirs.items()}  # + a name: its file
        inputs = _npy_listing(self.dirs["x"], "inputs", cache_dir)
        labels = _npy_listing(self.dirs["y"], "labels", cache_dir)
        if not inputs.same_names(labels):
            a, b = set(RelativePaths(inputs, absolute=False)), set(RelativePaths(labels, absolute=False))
            problems = [
                _unpaired(a, b, self.dirs["x"], self.dirs["y"]),
                _unpaired(b, a, self.dirs["y"], self.dirs["x"]),
            ]
            raise DataError("NpyPairs pairs files by name; " + "; ".join(p for p in problems if p))
        self._listing = inputs
        self._folders = LazyHandles(_open_folders, _close_folders)  # each process opens its own
        self._last: dict[str, _Layout] = {}  # each key's layout in the last batch read (a hint, checked)

    @property
    def names(self) -> RelativePaths:
        """The paired file names, sorted (read from the compact listing on demand)."""
        return RelativePaths(self._listing, absolute=False)

    def __len__(self) -> int:
        return len(self._listing)

    def paths(self, i: int) -> dict[str, str]:
        if not 0 <= i < len(self._listing):
            raise IndexError(f"sample id {i} out of range for NpyPairs of length {len(self._listing)}")
        name = self._listing.relative(i)
        return {key: os.path.join(d, name) for key, d in self.dirs.items()}

    def __getitem__(self, i: int) -> dict:
        return {key: read_npy(path) for key, path in self.paths(i).items()}

    def read_batch(self, ids: Sequence[int] | np.ndarray, allocate: Allocator | None = None) -> dict[str, np.ndarray]:
        """The pairs for ``ids`` read straight into one array per key. Any file that differs from
        the first (shape, dtype, Fortran order) raises; the engine then reads one by one, which
        names the sample. ``allocate``: where the arrays go (the source protocol's,
        ``sources/base.py``), asked once the first file of each key has given its layout."""
        names = self._listing.relatives_bytes(np.asarray(ids, np.int64))
        with self._folders.use((self.dirs["x"], self.dirs["y"])) as fds:
            folders = {key: _Folder(self.dirs[key], fd, self._prefixes[key]) for key, fd in zip(("x", "y"), fds)}
            layouts = {key: folder.layout(names[0], self._last.get(key)) for key, folder in folders.items()}
            self._last = layouts  # replaced whole: threads sharing the source each see one batch's
            out = (allocate or numpy_allocator)(
                {key: ((len(names), *layout.shape), layout.dtype) for key, layout in layouts.items()}
            )
            return {key: _read_stack(folder, names, layouts[key], out[key]) for key, folder in folders.items()}

    def close(self) -> None:
        """Close the directories this process opened to read from (reopened on the next read)."""
        self._folders.close()

    def locate(self, i: int) -> str:
        return ", ".join(self.paths(i).values())

    def fingerprint(self) -> str:
        return file_fingerprint(path for i in range(len(self)) for path in self.paths(i).values())

    def __repr__(self) -> str:
        return f"NpyPairs({self.dirs['x']!r}, {self.dirs['y']!r}, {len(self)} pairs)"


class _RowFile:
    """One process's handle on a C-order ``.npy`` file: rows are read with ``preadv``
    (``raw_rows``), so a file that shrinks while in use is an error naming it, never a SIGBUS."""

    def __init__(self, spec: MappedFile):
        self.spec = spec
        self.row_shape, self.dtype = spec.shape[1:], np.dtype(spec.dtype)
        self.raw = RawRows.contiguous(spec.offset, spec.shape[0], math.prod(self.row_shape) * self.dtype.itemsize)
        self.fd = os.open(spec.filename, os.O_RDONLY)

    def read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self.row_shape), self.dtype)
        short = read_rows(self.fd, self.raw, rows, out.view(np.uint8).reshape(len(rows), -1), GAP_BYTES)
        if short is not None:
            needed = self.spec.offset + self.raw.row_bytes * self.spec.shape[0]
            raise _shrunk(self.spec.filename, short, os.fstat(self.fd).st_size, needed)
        return out

    def close(self) -> None:
        os.close(self.fd)


class _FortranRows:
    """A Fortran-order file's rows are strided through it: mapped instead, its size checked
    before each read (a truncation racing a read can still kill the process with SIGBUS)."""

    def __init__(self, spec: MappedFile):
        self.spec = spec
        self.file = open(spec.filename, "rb")  # the mapped inode, whatever the path names later
        try:
            self.rows = spec.open(self.file)
        except ValueError as exc:  # numpy's message does not name the file
            self.file.close()
            raise DataError(
                f"{spec.filename}: cannot map {spec.dtype} {spec.shape} from byte {spec.offset} "
                f"(changed since the source was built?): {exc}"
            ) from exc

    def read(self, rows: np.ndarray) -> np.ndarray:
        needed = self.spec.offset + self.rows.nbytes
        size = os.fstat(self.file.fileno()).st_size
        if size < needed:
            raise _shrunk(self.spec.filename, (rows[0], rows[-1]), size, needed)
        return np.asarray(self.rows[rows])

    def close(self) -> None:
        """Closing an mmap that a live row still views raises; dropping it unmaps once the last
        view is gone. The file can close: the mapping holds a handle of its own."""
        self.file.close()


def _shrunk(filename: str, rows: tuple, size: int, needed: int) -> DataError:
    return DataError(
        f"{filename}: rows {rows[0]}..{rows[1]} end past the end of the file, now {size} bytes where "
        f"its header needs {needed} (cut short or rewritten since it was opened?)"
    )


def _open_rows(spec: MappedFile) -> _RowFile | _FortranRows:
    return _FortranRows(spec) if spec.order == "F" and len(spec.shape) > 1 else _RowFile(spec)


def _checked_mapping(path: str) -> MappedFile:
    """How to map ``path`` read-only, from its checked header (object arrays and 0-d arrays refused)."""
    fd = os.open(path, os.O_RDONLY)  # FileNotFoundError names the path
    try:
        layout = npy_layout(fd, path)
    finally:
        os.close(fd)
    if not layout.shape:
        raise DataError(f"{path}: holds a 0-d {layout.dtype} array; NpyArray needs rows (one dimension or more)")
    return MappedFile(path, layout.offset, layout.dtype, layout.shape, layout.order)


class NpyArray:
    """Serves ``{name: array[i]}`` for row ``i`` of large ``.npy`` files, e.g.
    ``NpyArray(x="x.npy", y="y.npy")`` (the same shape of call as ArraySource).

    Nothing is loaded: each process opens the files on first use and reads rows with
    ``preadv`` (nearby rows of a batch in one read), and the source pickles as paths and
    headers only. All files must have the same number of rows (DataError naming files and
    lengths). Rows come back as fresh arrays; ``read_many`` reads a batch in sorted row order.
    A file that shrinks while in use raises a DataError naming it (Fortran-order files are
    mapped instead, and checked before each read).
    """

    def __init__(self, **paths: str | os.PathLike[str]) -> None:
        if not paths:
            raise ValueError("NpyArray needs at least one named file, e.g. NpyArray(x='x.npy', y='y.npy')")
        self.files = {name: _checked_mapping(os.fspath(p)) for name, p in paths.items()}
        lengths = {f.filename: f.shape[0] for f in self.files.values()}
        if len(set(lengths.values())) != 1:
            raise DataError(f"NpyArray files must have the same number of rows, got {lengths}")
        self._len = next(iter(lengths.values()))
        self._handles = LazyHandles(_open_rows)  # closed by their own close()

    def __len__(self) -> int:
        return self._len

    def _blocks(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        blocks = {}
        for name, f in self.files.items():
            with self._handles.use(f) as rows_file:
                blocks[name] = rows_file.read(rows)
        return blocks

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._len:
            raise IndexError(f"sample id {i} out of range for NpyArray of length {self._len}")
        return {name: block[0, ...] for name, block in self._blocks(np.array([i], np.int64)).items()}

    def read_many(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        rows, back = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)  # sorted, deduplicated
        if not len(rows):
            return []
        if not (0 <= rows[0] and rows[-1] < self._len):
            raise IndexError(f"sample ids {rows[0]}..{rows[-1]} out of range for NpyArray of length {self._len}")
        blocks = self._blocks(rows)
        return [{name: block[k] for name, block in blocks.items()} for k in back]

    def locate(self, i: int) -> str:
        return f"row {i} of " + ", ".join(f.filename for f in self.files.values())

    def fingerprint(self) -> str:
        return file_fingerprint(f.filename for f in self.files.values())

    def close(self) -> None:
        self._handles.close()

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={f.dtype}{list(f.shape)}" for k, f in self.files.items())
        return f"NpyArray({shapes})"
