"""What data holds, before training: ``inspect_files`` for a directory or file, ``inspect_loader``
for any loader or source. ``steadyfeed inspect`` is their command line. Nothing is modified.

Files (a directory is walked recursively, in sorted order; names starting with ``.`` are
skipped, as ImageFolder does):

* file sizes: min / median / max and a histogram with power-of-two buckets;
* formats: images by Pillow (``JPEG``, ``PNG``, ...), ``.npy`` and HDF5 files by their
  headers, anything else by its extension;
* shapes and dtypes: ``HxWxC`` for images (from the header), the array shape and dtype for
  ``.npy``, every dataset of an HDF5 file; image modes (``RGB``, ``L``, ``RGBA``, ``CMYK``,
  ``I;16``, ...); and outliers, the files whose shape or mode differs from the most common;
* labels: files per class folder (the first folder below the root) when there are folders;
* unreadable files, each with its error. Images are judged by their header unless
  ``decode`` (or a quality check, which needs the pixels) asks for a full decode, which
  also finds truncated files.

A loader (or source) is read as stored: every sample once, one id per read, no
transform (``audit.scan_source``). Sizes are sample bytes, shapes and dtypes are per key,
labels are the histogram of the first label key that is categorical, and unreadable
samples are those that fail to read, with their location and error.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from .. import quality
from ..loader import Loader
from .audit import scan_source
from ..progress import progress_bar
from ..units import human_bytes

FORMAT = "steadyfeed.inspect/1"
LISTED = 1000  # items kept per list in as_dict (counts are always complete)
SHOWN = 10  # items shown per list in text
HDF5_EXTENSIONS = (".h5", ".hdf5", ".he5")


@dataclass
class InspectReport:
    """Counts are complete; ``unreadable`` and ``problems`` list every item found."""

    target: str
    kind: str  # "files" or "samples"
    count: int
    sizes: list[int] = field(default_factory=list)  # bytes per file or per sample
    formats: Counter = field(default_factory=Counter)
    shapes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # key -> "shape dtype" counts
    modes: Counter = field(default_factory=Counter)
    labels: Counter | None = None
    label_source: str = ""
    outliers: dict[str, quality.Outliers] = field(default_factory=dict)  # what differs -> outliers
    unreadable: list[dict] = field(default_factory=list)  # {"item", "error"}
    problems: list[quality.Problem] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Everything was readable and passed the quality checks asked for."""
        return not self.unreadable and not self.problems

    def as_dict(self) -> dict:
        return {
            "format": FORMAT, "passed": self.passed, "target": self.target, "kind": self.kind, "count": self.count,
            "sizes": size_summary(self.sizes), "formats": _counts(self.formats),
            "shapes": {key: _counts(c) for key, c in self.shapes.items()}, "modes": _counts(self.modes),
            "labels": None if self.labels is None else {"source": self.label_source, "counts": _counts(self.labels)},
            "outliers": {what: o.as_dict(LISTED) for what, o in self.outliers.items()},
            "unreadable": self.unreadable[:LISTED], "unreadable_count": len(self.unreadable),
            "problems": [p.as_dict() for p in self.problems[:LISTED]],
            "problem_count": len(self.problems),
        }

    def text(self) -> str:
        lines = [f"steadyfeed inspect {self.target}: {self.count} {self.kind}"]
        if self.sizes:
            lines += _size_lines(size_summary(self.sizes))
        for title, counts in [("formats", self.formats), ("modes", self.modes),
                              *((f"shapes {key}", c) for key, c in self.shapes.items())]:
            if counts:
                lines.append(f"  {title:14}{_listing(counts)}")
        if self.labels is not None:
            lines.append(f"  {'labels':14}{_listing(self.labels)}  ({self.label_source})")
        for what, o in self.outliers.items():
            if o.items:
                lines.append(f"  {'outliers':14}{len(o.items)} differ in {what} from the most common "
                             f"({o.common}, {o.common_count}): {_shown(o.items)}")
        lines += self._failures()
        lines.append("PASSED: everything readable" if self.passed else
                     f"FAILED: {len(self.unreadable)} unreadable, {len(self.problems)} quality problem(s)")
        return "\n".join(lines)

    def _failures(self) -> list[str]:
        lines = []
        for title, items in [("unreadable", [f"{u['item']}: {u['error']}" for u in self.unreadable]),
                             ("quality", [str(p) for p in self.problems])]:
            if items:
                lines.append(f"  {title:14}{len(items)}:")
                lines += [f"    {item}" for item in items[:SHOWN]]
                lines += [f"    ... and {len(items) - SHOWN} more"] if len(items) > SHOWN else []
        return lines


# -- summaries --------------------------------------------------------------------------------------
def size_summary(sizes: Sequence[int]) -> dict:
    """min / median / max and power-of-two buckets from the smallest to the largest size
    (``from`` inclusive, ``to`` exclusive; empty buckets in between included)."""
    if not len(sizes):
        return {"min": 0, "median": 0, "max": 0, "histogram": []}
    a = np.asarray(sizes, np.int64)
    bucket = np.where(a > 0, np.floor(np.log2(np.maximum(a, 1))).astype(np.int64) + 1, 0)  # 0: empty files
    counts = np.bincount(bucket - bucket.min())
    edges = [(0 if b == 0 else 2 ** (b - 1), 1 if b == 0 else 2 ** b) for b in range(bucket.min(), bucket.max() + 1)]
    return {"min": int(a.min()), "median": int(np.median(a)), "max": int(a.max()),
            "histogram": [{"from": lo, "to": hi, "count": int(c)} for (lo, hi), c in zip(edges, counts)]}


def _size_lines(summary: dict) -> list[str]:
    lines = [f"  {'sizes':14}min {human_bytes(summary['min'])}, median {human_bytes(summary['median'])}, "
             f"max {human_bytes(summary['max'])}"]
    peak = max(b["count"] for b in summary["histogram"])
    for b in summary["histogram"]:
        bar = "#" * max(1, round(30 * b["count"] / peak)) if b["count"] else ""
        lines.append(f"  {'':14}{human_bytes(b['from']):>9} - {human_bytes(b['to']):<9} {b['count']:>7}  {bar}".rstrip())
    return lines


def _counts(counter: Counter) -> dict:
    return {str(k): v for k, v in counter.most_common()}


def _listing(counter: Counter) -> str:
    common = counter.most_common()
    text = ", ".join(f"{k} {v}" for k, v in common[:SHOWN])
    return text + (f", ... ({len(common)} distinct)" if len(common) > SHOWN else "")


def _shown(items: list) -> str:
    return ", ".join(map(str, items[:SHOWN])) + (f", ... ({len(items)} in all)" if len(items) > SHOWN else "")


def shape_text(shape: Sequence[int], dtype: Any = None) -> str:
    text = "x".join(map(str, shape)) if len(shape) else "scalar"
    return f"{text} {np.dtype(dtype)}" if dtype is not None else text


# -- files ------------------------------------------------------------------------------------------
@dataclass
class FileInfo:
    """What one file is: its format, the shapes it holds (key -> text), its image mode, or its error."""

    size: int
    format: str
    shapes: dict[str, str] = field(default_factory=dict)
    mode: str | None = None
    error: str | None = None
    problems: list[quality.Problem] = field(default_factory=list)


def list_files(path: str | os.PathLike) -> list[str]:
    """``path`` itself when a file, else every file below it (sorted, names starting with "." skipped)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or directory: {path}")
    if not os.path.isdir(path):
        return [path]
    found = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [os.path.join(dirpath, f) for f in filenames if not f.startswith(".")]
    return sorted(found)


def probe(path: str, *, decode: bool = False, checks: Sequence[str] = ()) -> FileInfo:
    """What ``path`` holds; never raises for a bad file (its error is in ``FileInfo.error``)."""
    ext = os.path.splitext(path)[1].lower()
    try:
        info = FileInfo(os.path.getsize(path), ext.lstrip(".") or "(no extension)")
        if ext in _image_extensions():
            _probe_image(path, info, decode or bool(checks), checks)
        elif ext == ".npy":
            _probe_npy(path, info, decode or bool(checks), checks)
        elif ext in HDF5_EXTENSIONS:
            _probe_hdf5(path, info)
    except Exception as exc:  # untrusted files make readers raise anything; report it, go on
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        return FileInfo(size, ext.lstrip(".") or "(no extension)", error=f"{type(exc).__name__}: {exc}")
    return info


def _image_extensions() -> frozenset:
    try:
        from ..sources.images import IMAGE_EXTENSIONS
    except ImportError:  # no Pillow: images are files like any other
        return frozenset()
    return IMAGE_EXTENSIONS


def _probe_image(path: str, info: FileInfo, decode: bool, checks: Sequence[str]) -> None:
    from PIL import Image

    with Image.open(path) as image:  # reads the header only
        info.format, info.mode = image.format or info.format, image.mode
        info.shapes["image"] = shape_text((image.height, image.width, len(image.getbands())))
        if decode:
            image.load()  # raises for truncated or corrupt pixel data
            info.problems = quality.sample_problems(path, {"image": np.asarray(image)}, checks)


def _probe_npy(path: str, info: FileInfo, decode: bool, checks: Sequence[str]) -> None:
    from ..sources import npy

    fd = os.open(path, os.O_RDONLY)
    try:
        layout = npy.npy_layout(fd, path)  # the header, checked against the file size; no data read
    finally:
        os.close(fd)
    info.format, info.shapes["npy"] = "npy", shape_text(layout.shape, layout.dtype)
    if decode:
        info.problems = quality.sample_problems(path, {"npy": npy.read_npy(path)}, checks)


def _probe_hdf5(path: str, info: FileInfo) -> None:
    try:
        import h5py
    except ImportError:  # no h5py: an HDF5 file is a file like any other
        return

    with h5py.File(path, "r") as f:
        info.format = "hdf5"
        f.visititems(lambda name, obj: info.shapes.__setitem__(f"/{name}", shape_text(obj.shape, obj.dtype))
                     if isinstance(obj, h5py.Dataset) else None)


def inspect_files(path: str | os.PathLike, *, decode: bool = False, checks: Sequence[str] = (), workers: int = 0,
                  progress: bool = False) -> InspectReport:
    """Inspect a directory (recursively) or one file; ``workers`` threads read files at once."""
    root = os.fspath(path)
    files = list_files(root)
    checks = quality.check_names(checks)
    report = InspectReport(root, "files", len(files))
    # threads, because file reads and image decoders release the GIL
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="inspect") if workers > 0 else None
    infos = {}
    try:
        with progress_bar(len(files), f"inspect {os.path.basename(root.rstrip(os.sep)) or root}", unit=" files",
                          enabled=progress) as bar:
            probed = (pool.map if pool else map)(lambda f: probe(f, decode=decode, checks=checks), files)
            for name, info in zip(files, probed):
                infos[os.path.relpath(name, root) if name != root else os.path.basename(name)] = info
                bar.update(1)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for name, info in infos.items():
        _add_file(report, name, info)
    _file_outliers(report, infos)
    classes = [name.split(os.sep)[0] for name in infos if os.sep in name]
    if classes:
        report.labels, report.label_source = Counter(classes), "files per class folder"
    return report


def _add_file(report: InspectReport, name: str, info: FileInfo) -> None:
    report.sizes.append(info.size)
    if info.error:
        report.unreadable.append({"item": name, "error": info.error})
        return
    report.formats[info.format] += 1
    for key, shape in info.shapes.items():
        report.shapes[key][shape] += 1
    if info.mode is not None:
        report.modes[info.mode] += 1
    report.problems += [dataclasses.replace(p, sample_id=name) for p in info.problems]


def _file_outliers(report: InspectReport, infos: dict[str, FileInfo]) -> None:
    for what, value in [("image mode", lambda i: i.mode), ("image shape", lambda i: i.shapes.get("image")),
                        ("npy shape", lambda i: i.shapes.get("npy"))]:
        values = {name: v for name, info in infos.items() if (v := value(info)) is not None}
        found = quality.outliers(values)
        if found is not None:
            report.outliers[what] = found


# -- a loader ----------------------------------------------------------------------------------------
def inspect_loader(loader: Loader, *, label_keys: Iterable[str] = ("y",), checks: Sequence[str] = (),
                   target: str = "", progress: bool = False) -> InspectReport:
    """Inspect the samples of ``loader``'s source as stored (see the module docstring)."""
    label_keys, checks = tuple(label_keys), quality.check_names(checks)
    report = InspectReport(target or repr(loader.source), "samples", len(loader.source))
    shapes: dict[str, dict[int, str]] = defaultdict(dict)

    def visit(i: int, sample: dict) -> None:
        report.sizes.append(sum(int(a.nbytes) for a in sample.values()))
        for key, a in sample.items():
            shapes[key][i] = shape_text(a.shape, a.dtype)
            report.shapes[key][shapes[key][i]] += 1

    with progress_bar(len(loader.source), "inspect", unit=" samples", enabled=progress) as bar:
        scan = scan_source(loader, label_keys, checks, setting=(loader.config.execution.workers, loader.config.execution.mode), bar=bar, visit=visit)
    report.problems = scan.problems
    report.unreadable = [{"item": e["location"] or f"sample {e['sample_id']}", "sample_id": e["sample_id"],
                          "error": f"{e['error_type']}: {e['message']}"} for e in scan.failed]
    report.outliers = {f"shape of {key!r}": o for key, values in shapes.items() if (o := quality.outliers(values))}
    key = next((k for k in label_keys if scan.classes(k) is not None), None)
    if key is not None:
        report.labels, report.label_source = scan.classes(key), f"key {key!r}"
    return report
