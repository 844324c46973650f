"""What data holds, before training: ``inspect_files`` for a directory or file, ``inspect_loader``
for any loader or source. ``steadyfeed inspect`` is their command line. Nothing is modified.

It reads with the sources' own readers (``inspect_formats.py``), so it never passes what a
loader would refuse, and lists why. Each finding is one of:

* ``unreadable``: a file (or a record, a sample) that fails to read, with its error;
* ``refused``: data that reads but that a loader refuses: an empty class folder (ImageFolder
  refuses the tree), images of another size than the others under ``collate="stack"``
  (without ``size``), variable-length HDF5 strings under ``"stack"``, a CSV row of the wrong
  length or a non-number in a numeric column, a TFRecord feature missing from some records;
* ``ignored``: files no source reads (``notes.txt`` in an image tree, ``*.sfidx.npy`` index
  caches): listed, not counted as data;
* ``problems``: failed quality ``checks``.

Files (a directory is walked recursively, in sorted order; names starting with ``.`` are
skipped). A directory whose sub-folders hold images is an **image tree**, read as
``ImageFolder`` reads it (its classes, the images of each, what it ignores); anything else
is read file by file, by format:

* images: format, mode and size from the header (``decode``: the pixels, as ImageFolder
  decodes them, which also finds truncated files), sizes and modes histograms, outliers;
* ``.npy``: shape and dtype from the checked header; HDF5: a table of datasets (shape, dtype,
  variable-length string lengths); CSV: rows and a table of columns (type, missing values);
  TFRecord: records and a table of features (kind, values, bytes, the ``--feature`` flags
  that read them);
* file sizes (min / median / max, power-of-two histogram) and labels (images per class).

A loader (or source) is read as stored: every sample once, one id per read, no transform
(``audit.scan_source``). Sizes are sample bytes, shapes and dtypes are per key, labels are
the histogram of the first label key that is categorical, unreadable samples are those that
fail to read, and samples whose shape or dtype a batch could not hold with the others (under
the loader's ``collate``) are refused.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import quality
from ..diagnostics import image_quality
from ..errors import DataError
from ..execution.batch import layout_conflict
from ..loader import Loader
from ..progress import progress_bar
from ..sources.base import locate
from ..units import human_bytes
from .audit import image_findings, scan_source
from .inspect_formats import (
    HDF5_EXTENSIONS,
    PARQUET_EXTENSIONS,
    TAR_EXTENSIONS,
    FileInfo,
    looks_like_tfrecord,
    probe_csv,
    probe_hdf5,
    probe_image,
    probe_npy,
    probe_parquet,
    probe_tar,
    probe_tfrecord,
    refusal,
    shape_text,
)
from .tables import table

FORMAT = "steadyfeed.inspect/2"
LISTED = 1000  # items kept per list in as_dict (counts are always complete)
SHOWN = 10  # items shown per list in text
INDEX_CACHE = ".sfidx.npy"
RAW_COPY = ".sfraw"  # framing.RAW_SUFFIX (not imported: TFRecord support is optional)

__all__ = ["InspectReport", "inspect_files", "inspect_loader", "list_files", "probe", "shape_text", "size_summary"]


@dataclass
class InspectReport:
    """Counts are complete; ``unreadable``, ``refused``, ``ignored`` and ``problems`` list every item found."""

    target: str
    kind: str  # "files", "image tree" or "samples"
    count: int
    sizes: list[int] = field(default_factory=list)  # bytes per file or per sample
    formats: Counter = field(default_factory=Counter)
    shapes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # key -> "shape dtype" counts
    modes: Counter = field(default_factory=Counter)
    image_sizes: Counter = field(default_factory=Counter)  # "HxW" counts
    labels: Counter | None = None
    label_source: str = ""
    outliers: dict[str, quality.Outliers] = field(default_factory=dict)  # what differs -> outliers
    unreadable: list[dict] = field(default_factory=list)  # {"item", "error"}
    refused: list[dict] = field(default_factory=list)  # {"item", "reason"}
    ignored: list[dict] = field(default_factory=list)  # {"item", "reason"}
    problems: list[quality.Problem] = field(default_factory=list)
    tables: dict[str, dict] = field(default_factory=dict)  # file -> its format's table (csv, hdf5, tfrecord)
    notes: list[str] = field(default_factory=list)
    collate: str = "stack"
    findings: dict = field(default_factory=dict)  # the sections of diagnostics/__init__.py ("quality")

    @property
    def passed(self) -> bool:
        """Everything is readable, nothing would be refused, the quality checks asked for passed."""
        return not self.unreadable and not self.refused and not self.problems

    def as_dict(self) -> dict:
        return {
            "format": FORMAT,
            "passed": self.passed,
            "target": self.target,
            "kind": self.kind,
            "count": self.count,
            "collate": self.collate,
            "sizes": size_summary(self.sizes),
            "formats": _counts(self.formats),
            "shapes": {key: _counts(c) for key, c in self.shapes.items()},
            "modes": _counts(self.modes),
            "image_sizes": _counts(self.image_sizes),
            "labels": None if self.labels is None else {"source": self.label_source, "counts": _counts(self.labels)},
            "outliers": {what: o.as_dict(LISTED) for what, o in self.outliers.items()},
            "unreadable": self.unreadable[:LISTED],
            "unreadable_count": len(self.unreadable),
            "refused": self.refused[:LISTED],
            "refused_count": len(self.refused),
            "ignored": self.ignored[:LISTED],
            "ignored_count": len(self.ignored),
            "problems": [p.as_dict() for p in self.problems[:LISTED]],
            "problem_count": len(self.problems),
            "tables": self.tables,
            "notes": self.notes,
            "findings": self.findings,
        }

    def text(self) -> str:
        unit = "sample" if self.kind == "samples" else "file"
        lines = [
            f"steadyfeed inspect {self.target}: {self.count} {unit}{'' if self.count == 1 else 's'}"
            + (" (an image tree, read as ImageFolder reads it)" if self.kind == "image tree" else "")
        ]
        if self.sizes:
            lines += _size_lines(size_summary(self.sizes))
        for title, counts in [
            ("formats", self.formats),
            ("modes", self.modes),
            ("image sizes", self.image_sizes),
            *((f"shapes {key}", c) for key, c in self.shapes.items() if self.kind == "samples"),
        ]:
            if counts:
                lines.append(f"  {title:14}{_listing(counts)}")
        if self.labels is not None:
            lines.append(f"  {'labels':14}{_listing(self.labels)}  ({self.label_source})")
        for what, o in self.outliers.items():
            if o.items:
                lines.append(
                    f"  {'outliers':14}{len(o.items)} differ in {what} from the most common "
                    f"({o.common}, {o.common_count}): {_shown(o.items)}"
                )
        lines += _table_lines(self.tables)
        lines += [f"  {'note':14}{note}" for note in self.notes]
        lines += self._findings()
        lines.append(
            f"PASSED: everything readable, nothing a loader (collate={self.collate!r}) would refuse"
            if self.passed
            else f"FAILED: {len(self.unreadable)} unreadable, {len(self.refused)} refused by a loader, "
            f"{len(self.problems)} quality problem(s)"
        )
        return "\n".join(lines)

    def _findings(self) -> list[str]:
        lines = []
        for title, items in [
            ("ignored", [f"{i['item']}: {i['reason']}" for i in self.ignored]),
            ("unreadable", [f"{u['item']}: {u['error']}" for u in self.unreadable]),
            ("refused", [f"{r['item']}: {r['reason']}" for r in self.refused]),
            ("quality", [str(p) for p in self.problems]),
        ]:
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
    edges = [(0 if b == 0 else 2 ** (b - 1), 1 if b == 0 else 2**b) for b in range(bucket.min(), bucket.max() + 1)]
    return {
        "min": int(a.min()),
        "median": int(np.median(a)),
        "max": int(a.max()),
        "histogram": [{"from": lo, "to": hi, "count": int(c)} for (lo, hi), c in zip(edges, counts)],
    }


def _size_lines(summary: dict) -> list[str]:
    lines = [
        f"  {'sizes':14}min {human_bytes(summary['min'])}, median {human_bytes(summary['median'])}, "
        f"max {human_bytes(summary['max'])}"
    ]
    peak = max(b["count"] for b in summary["histogram"])
    for b in summary["histogram"]:
        bar = "#" * max(1, round(30 * b["count"] / peak)) if b["count"] else ""
        lines.append(
            f"  {'':14}{human_bytes(b['from']):>9} - {human_bytes(b['to']):<9} {b['count']:>7}  {bar}".rstrip()
        )
    return lines


_TABLES = {  # format -> (the list in its table, the columns shown)
    "csv": ("columns", ["name", "type", "missing", "note"]),
    "hdf5": ("datasets", ["dataset", "shape", "dtype", "note"]),
    "tfrecord": ("features", ["feature", "kind", "values", "bytes", "records", "inferred", "note"]),
    "parquet": ("columns", ["name", "type", "nulls", "note"]),
    "webdataset": ("members", ["extension", "samples", "bytes"]),
}


def _table_lines(tables: dict[str, dict]) -> list[str]:
    lines = []
    for name, summary in list(tables.items())[:SHOWN]:
        what, columns = _TABLES[summary["format"]]
        counts = ", ".join(
            f"{summary[k]} {k.replace('_', ' ')}" for k in ("rows", "row_groups", "records", "samples") if k in summary
        )
        if summary.get("compression", "none") != "none":
            counts += f", {summary['compression']}-compressed"
        lines.append(f"  {summary['format']:14}{name}{f': {counts}' if counts else ''}")
        lines += table(
            columns, [[str(row[c]) for c in columns] for row in summary[what]], indent=" " * 16, numbers_right=True
        )
        if summary.get("read_with"):
            lines.append(f"  {'':14}read it with: --tfrecord {name} {summary['read_with']}")
    if len(tables) > SHOWN:
        lines.append(f"  {'':14}... and {len(tables) - SHOWN} more files (see --json)")
    return lines


def _counts(counter: Counter) -> dict:
    return {str(k): v for k, v in counter.most_common()}


def _listing(counter: Counter) -> str:
    common = counter.most_common()
    text = ", ".join(f"{k} {v}" for k, v in common[:SHOWN])
    return text + (f", ... ({len(common)} distinct)" if len(common) > SHOWN else "")


def _shown(items: list) -> str:
    return ", ".join(map(str, items[:SHOWN])) + (f", ... ({len(items)} in all)" if len(items) > SHOWN else "")


# -- files ------------------------------------------------------------------------------------------
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


def _image_reader(size=None, channels: int = 3):
    try:
        from ..sources.images import ImageReader
    except ImportError:  # no Pillow: images are files like any other
        return None
    return ImageReader(size, channels)


def _ignored_reason(path: str) -> str | None:
    """Why no source reads ``path`` as data, or None when one may."""
    if path.endswith(INDEX_CACHE):
        return "a steadyfeed index cache (rebuilt when stale), not data"
    if path.endswith(RAW_COPY):
        return "a steadyfeed decompressed copy of a compressed TFRecord file (rebuilt when stale), not data"
    if os.path.basename(path) == "manifest.json":
        return "the manifest of a pack output (TFRecordSource(DIR) reads it with the shards)"
    return None


def probe(
    path: str,
    name: str | None = None,
    *,
    reader: Any = None,
    decode: bool = False,
    checks: Sequence[str] = (),
    collate: str = "stack",
) -> FileInfo | None:
    """What ``path`` holds (None: a format no source reads); never raises for a bad file
    (its error is in ``FileInfo.error``)."""
    name = name or os.path.basename(path)
    ext = os.path.splitext(path)[1].lower()
    reader = reader if reader is not None else _image_reader()
    info = FileInfo(os.path.getsize(path), ext.lstrip(".") or "(no extension)")
    try:
        if reader is not None and ext in _image_extensions():
            probe_image(reader, path, info, decode or bool(checks), checks)
        elif ext == ".npy":
            probe_npy(path, info, decode or bool(checks), checks)
        elif ext in HDF5_EXTENSIONS:
            probe_hdf5(path, name, info, collate)
        elif ext == ".csv":
            probe_csv(path, name, info)
        elif ext in PARQUET_EXTENSIONS:
            probe_parquet(path, name, info)
        elif ext in TAR_EXTENSIONS:
            probe_tar(path, name, info)
        elif looks_like_tfrecord(path):
            probe_tfrecord(path, name, info)
        else:
            return None
    except DataError as exc:  # the source's own message: it names the file and what was expected
        info.error = str(exc)
    except Exception as exc:  # untrusted files make readers raise anything; report it, go on
        info.error = f"{type(exc).__name__}: {exc}"
    return info


def _image_extensions() -> frozenset:
    try:
        from ..sources.images import IMAGE_EXTENSIONS
    except ImportError:
        return frozenset()
    return IMAGE_EXTENSIONS


def _image_tree(root: str):
    """ImageFolder's view of ``root`` when it is a directory whose sub-folders hold images, else None."""
    if not os.path.isdir(root):
        return None
    try:
        from ..sources.images import scan_tree

        tree = scan_tree(root)
    except Exception:  # no Pillow, no class folders, an unlistable folder: not an image tree
        return None
    return tree if any(tree.images.values()) else None


def inspect_files(
    path: str | os.PathLike,
    *,
    decode: bool = False,
    checks: Sequence[str] = (),
    workers: int = 0,
    progress: bool = False,
    collate: str = "stack",
    size=None,
    channels: int = 3,
    files: Sequence[str] | None = None,
    thresholds: dict[str, float] | None = None,
) -> InspectReport:
    """Inspect a directory (recursively), one file, or ``files`` (shown relative to ``path``);
    ``workers`` threads read files at once; ``collate``, ``size`` and ``channels`` are the
    loader's and ImageFolder's settings that what is refused depends on."""
    root = os.fspath(path)
    checks = quality.check_names(checks)
    tree = _image_tree(root) if files is None else None
    report = InspectReport(root, "image tree" if tree else "files", 0, collate=collate)
    if tree is not None:
        listed = [f for name in tree.classes for f in tree.images[name]]
        report.ignored += [{"item": _rel(p, root), "reason": why} for p, why in tree.ignored]
        report.refused += [
            {"item": _rel(os.path.join(root, name), root) + os.sep, "reason": str(error)}
            for name, error in tree.empty.items()
        ]
        report.labels = Counter({name: len(tree.images[name]) for name in tree.classes})
        report.label_source = "images per class folder"
    else:
        listed = list(files) if files is not None else list_files(root)
    reader = _image_reader(size, channels)
    infos = _probe_all(root, listed, reader, decode, checks, collate, workers, progress)
    for name, info in infos.items():
        _add_file(report, name, info)
    _file_outliers(report, infos)
    if tree is not None:
        _refuse_mixed_images(report, infos, collate)
    _judge_files(report, infos, thresholds, tree is not None)
    return report


def _judge_files(report: InspectReport, infos: dict[str, FileInfo | str], given, classes: bool) -> None:
    """The image checks over every file scored (``FileInfo.scores``): ids are positions in the
    listing (ImageFolder's ids for an image tree), labels the class folders."""
    names = [name for name, info in infos.items() if isinstance(info, FileInfo) and info.scores]
    if not names:
        return
    scored = {n: info.scores for n in names if isinstance(info := infos[n], FileInfo)}  # all of names
    checks = list(scored[names[0]])
    scores = {c: np.array([scored[n].get(c, np.nan) for n in names]) for c in checks}
    labels = [n.split(os.sep, 1)[0] for n in names] if classes else None
    where = {name: j for j, name in enumerate(infos)}
    ids = np.array([where[n] for n in names], np.int64)
    report.findings["quality"] = found = image_quality.findings(
        ids, scores, labels=labels, given=given, locate=dict(zip(ids.tolist(), names)).get
    )
    report.problems += flagged_problems(found, key="image", by_file=True)


def flagged_problems(found: dict, key: str, by_file: bool = False) -> list[quality.Problem]:
    """A quality problem per flagged image of a ``"quality"`` section, named by id (or file)."""
    return [
        quality.Problem(
            f.get("file", f["id"]) if by_file else f["id"],
            check.get("key", key),
            name,
            image_quality.problem(name, f["score"], check["threshold"]),
        )
        for name, check in found["checks"].items()
        for f in check["flagged"]
    ]


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root) if path != root else os.path.basename(path)


def _probe_all(root, listed, reader, decode, checks, collate, workers, progress) -> dict[str, FileInfo | str]:
    """``{name: FileInfo}`` for each file a source may read, ``{name: why}`` for the others, in order."""
    names = [_rel(f, root) for f in listed]

    def one(job: tuple[str, str]) -> FileInfo | str:
        path, name = job
        why = _ignored_reason(path)
        found = None if why else probe(path, name, reader=reader, decode=decode, checks=checks, collate=collate)
        return found if found is not None else why or f"no steadyfeed source reads {_kind(path)} files"

    # threads, because file reads and image decoders release the GIL
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="inspect") if workers > 0 else None
    try:
        with progress_bar(
            len(listed), f"inspect {os.path.basename(root.rstrip(os.sep)) or root}", unit=" files", enabled=progress
        ) as bar:
            infos = {}
            for name, info in zip(names, (pool.map if pool else map)(one, zip(listed, names))):
                infos[name] = info
                bar.update(1)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return infos


def _kind(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    return f"{ext}" if ext else "extensionless"


def _add_file(report: InspectReport, name: str, info: FileInfo | str) -> None:
    if isinstance(info, str):
        report.ignored.append({"item": name, "reason": info})
        return
    report.count += 1
    report.sizes.append(info.size)
    if info.error:
        report.unreadable.append({"item": name, "error": info.error})
        return
    report.formats[info.format] += 1
    for key, shape in info.shapes.items():
        report.shapes[key][shape] += 1
    if info.mode is not None:
        report.modes[info.mode] += 1
    if info.image is not None:
        report.image_sizes[shape_text(info.image)] += 1
    report.unreadable += [{"item": item, "error": error} for item, error in info.unreadable]
    report.refused += [{"item": item, "reason": why} for item, why in info.refused]
    report.notes += [f"{name}: {note}" for note in info.notes]
    report.problems += [dataclasses.replace(p, sample_id=name) for p in info.problems]
    if info.table is not None:
        report.tables[name] = {"format": info.format, **info.table}


def _file_outliers(report: InspectReport, infos: dict[str, FileInfo | str]) -> None:
    read = {name: info for name, info in infos.items() if isinstance(info, FileInfo) and not info.error}
    for what, value in [
        ("image mode", lambda i: i.mode),
        ("image shape", lambda i: i.shapes.get("image")),
        ("npy shape", lambda i: i.shapes.get("npy")),
    ]:
        values = {name: v for name, info in read.items() if (v := value(info)) is not None}
        found = quality.outliers(values)
        if found is not None:
            report.outliers[what] = found


def _refuse_mixed_images(report: InspectReport, infos: dict[str, FileInfo | str], collate: str) -> None:
    """The images whose sample (after ImageFolder's resize and conversion) a batch could not hold
    with the most common one: the loader's own rule (``layout_conflict``)."""
    outputs = {
        name: info.output
        for name, info in infos.items()
        if isinstance(info, FileInfo) and info.output is not None and not info.error
    }
    found = quality.outliers(outputs)
    if found is None:
        return
    common = found.common
    for name in found.items:
        shape, dtype = outputs[name]
        what = layout_conflict(common, outputs[name], collate)
        if what is not None:
            report.refused.append(
                {
                    "item": name,
                    "reason": refusal(
                        what,
                        f"{shape_text(shape[:2])} image where {found.common_count} are {shape_text(common[0][:2])}",
                        collate,
                    ),
                }
            )


# -- a loader ----------------------------------------------------------------------------------------
def inspect_loader(
    loader: Loader,
    *,
    label_keys: Iterable[str] = ("y",),
    checks: Sequence[str] = (),
    target: str = "",
    progress: bool = False,
    thresholds: dict[str, float] | None = None,
) -> InspectReport:
    """Inspect the samples of ``loader``'s source as stored (see the module docstring)."""
    label_keys, checks = tuple(label_keys), quality.check_names(checks)
    collate = loader.config.read.collate
    report = InspectReport(target or repr(loader.source), "samples", len(loader.source), collate=collate)
    layouts: dict[str, dict[int, tuple]] = defaultdict(dict)

    def visit(i: int, sample: dict) -> None:
        report.sizes.append(sum(int(a.nbytes) for a in sample.values()))
        for key, a in sample.items():
            layouts[key][i] = (a.shape, a.dtype)
            report.shapes[key][shape_text(a.shape, a.dtype)] += 1

    execution = loader.config.execution
    with progress_bar(len(loader.source), "inspect", unit=" samples", enabled=progress) as bar:
        scan = scan_source(
            loader, label_keys, checks, setting=(execution.workers, execution.mode), bar=bar, visit=visit
        )
    report.problems = scan.problems
    report.findings = image_findings(scan, loader, label_keys, thresholds)
    if report.findings:
        report.problems += flagged_problems(report.findings["quality"], key="x")
    report.unreadable = [
        {
            "item": e["location"] or f"sample {e['sample_id']}",
            "sample_id": e["sample_id"],
            "error": f"{e['error_type']}: {e['message']}",
        }
        for e in scan.failed
    ]
    report.outliers = {
        f"shape of {key!r}": o
        for key, values in layouts.items()
        if (o := quality.outliers({i: shape_text(*v) for i, v in values.items()}))
    }
    report.refused = _refused_samples(loader, layouts, collate)
    key = next((k for k in label_keys if scan.classes(k) is not None), None)
    if key is not None:
        report.labels, report.label_source = scan.classes(key), f"key {key!r}"
    return report


def _refused_samples(loader: Loader, layouts: dict[str, dict[int, tuple]], collate: str) -> list[dict]:
    """Samples a batch could not hold with the most common layout of a key, under ``collate``."""
    refused = []
    for key, values in layouts.items():
        found = quality.outliers(values)
        if found is None:
            continue
        for i in found.items:
            what = layout_conflict(found.common, values[i], collate)
            if what is not None:
                where = locate(loader.source, i)
                refused.append(
                    {
                        "item": where or f"sample {i}",
                        "sample_id": i,
                        "reason": refusal(
                            what,
                            f"key {key!r}: sample {i} has {shape_text(*values[i])} where {found.common_count} have "
                            f"{shape_text(*found.common)}",
                            collate,
                            key,
                        ),
                    }
                )
    return sorted(refused, key=lambda r: r["sample_id"])
