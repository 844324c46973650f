"""``audit(loader)``: run a loader the way training will, at several worker settings, and check
what steadyfeed promises about what it delivered. ``steadyfeed audit`` is its command line.

What is checked (each a :class:`CheckResult` of the :class:`AuditReport`):

* ``readable``: one pass over the source as stored (id order, one id per read, no
  transform) reads every sample without error. That pass also records each sample's label keys, its content
  digest (for ``against``) and the ``checks`` of :mod:`steadyfeed.quality`
  (``quality:<name>``); image checks (``blur``, ``underexposed``, ``overexposed``,
  ``low_contrast``) are scored by that pass's workers and judged against ``thresholds`` or
  the scores' own robust outliers (``diagnostics/image_quality.py``); the report's
  ``findings["quality"]`` lists the flagged images with a per-class breakdown. With
  ``near_duplicates`` (a distance in bits), the same workers hash every image
  (``diagnostics/near_duplicates.py``): ``near_duplicates`` fails for pairs of near-identical
  images within the split, ``near_contamination`` for pairs across it and ``against``;
  ``findings["duplicates"]`` lists the pairs, closest first.
* ``exactly_once`` per setting and epoch: the delivered ids (padded rows left out) are
  every id of ``range(len(source))`` exactly once, none out of range. With shards, all
  ``shard_count`` shards of the epoch are run and checked together (disjoint and
  complete). Under ``drop_last`` / ``last_batch="drop"`` the ids must be distinct and
  exactly as many as the documented rule keeps (``R * ((N // R) // B) * B``); which
  ones were dropped is the sampler's choice and is not checked. Ids the loader excludes in
  that epoch (``exclude=``, ``loader.exclude``) are expected absent: they are reported as
  ``excluded``, never as missing, and one that is delivered fails the check. Samples skipped under
  ``on_error="skip"`` and an epoch stopped by an error fail the check. With a
  :class:`~steadyfeed.WeightedSampler` ids repeat or stay out by design: the check is
  ``ids_in_range`` instead.
* ``reproducible``: each epoch's digest (every key, every byte, in order) is the same at
  every setting; an epoch stopped by an error is left out of the comparison.
* ``pairing``: each delivered row's label keys equal those of ``source[id]``: catches a
  pipeline that mixes pairs (it assumes the transform leaves label keys as they are).
* ``check``: ``check(batch)`` (the batch with ``"id"``) returns True, or True per row,
  for every batch delivered: catches a source whose stored pairs are wrong, e.g. with
  ``y = f(x)`` as the check.
* ``label_drift_epochs``: the total variation distance between each epoch's delivered
  label histogram and epoch 0's stays within ``drift_threshold`` (categorical labels only).
* with ``against`` (another loader, e.g. the validation split): ``contamination``, no
  sample of one has the same content (every key but the label keys) as a sample of the
  other, and ``label_drift_splits``, their label histograms are within ``drift_threshold``.

``loader`` itself is never iterated: every run uses ``loader.replace(...)`` and is closed
before the next starts. Nothing is written (a quarantine file of the loader is not used).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import quality
from ..config import MODES
from ..diagnostics import image_quality, near_duplicates
from ..loader import Loader
from ..progress import progress_bar
from ..sampling.samplers import WeightedSampler
from ..sources.base import locate
from .spec import at_setting, batch_rows, raw_loader, real_rows

FORMAT = "steadyfeed.audit/1"
DEFAULT_SETTINGS = ((0, "thread"), (2, "thread"), (2, "process"))
LISTED_IDS = 1000  # ids kept per finding in details (counts are always complete)
SHOWN_IDS = 8  # ids in a one-line summary
PASS, FAIL, SKIP = "pass", "fail", "skip"


# -- the report ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckResult:
    """One line of the report. ``status`` is "pass", "fail" or "skip" (not applicable, with why)."""

    name: str
    status: str
    summary: str
    setting: str | None = None
    epoch: int | None = None
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status != FAIL


@dataclass
class AuditReport:
    target: str
    samples: int
    epochs: int
    settings: list[str]
    loader: str
    checks: list[CheckResult]
    findings: dict = field(default_factory=dict)  # the sections of diagnostics/__init__.py

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def as_dict(self) -> dict:
        """JSON-ready and stable: ``format``, ``passed``, the run's shape, ``checks`` in report order."""
        return {
            "format": FORMAT,
            "passed": self.passed,
            "target": self.target,
            "samples": self.samples,
            "epochs": self.epochs,
            "settings": self.settings,
            "loader": self.loader,
            "checks": [{**asdict(c), "passed": c.passed} for c in self.checks],
            "findings": self.findings,
        }

    def table(self) -> str:
        """One line per check: status, name, where, what was found."""
        lines = [
            f"steadyfeed audit {self.target}: {self.samples} samples, {self.epochs} epoch(s) at "
            f"{', '.join(self.settings)}"
        ]
        for c in self.checks:
            where = ", ".join(filter(None, [c.setting, None if c.epoch is None else f"epoch {c.epoch}"]))
            lines.append(f"{c.status.upper():4}  {c.name:20} {where:26} {c.summary}")
        failed = len(self.failed)
        lines.append(f"{'PASSED' if not failed else 'FAILED'}: {failed} of {len(self.checks)} checks failed")
        return "\n".join(lines)


def setting_label(workers: int, mode: str) -> str:
    return "workers=0" if workers == 0 else f"workers={workers} {mode}"


def parse_settings(text: str) -> list[tuple[int, str]]:
    """``"0,2,2:process"`` -> [(0, "thread"), (2, "thread"), (2, "process")]."""
    settings = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        workers, _, mode = item.partition(":")
        if not workers.isdigit() or mode not in ("", *MODES):
            raise ValueError(f"a setting is WORKERS or WORKERS:MODE ({' or '.join(MODES)}), got {item!r}")
        settings.append((int(workers), mode or "thread"))
    if not settings:
        raise ValueError("give at least one setting, e.g. 0,2,2:process")
    return settings


def _idlist(ids: Iterable[int]) -> dict:
    ids = sorted({int(i) for i in ids})
    return {"count": len(ids), "ids": ids[:LISTED_IDS]}


def _shown(ids: Iterable) -> str:
    ids = sorted(set(ids))
    return ", ".join(map(str, ids[:SHOWN_IDS])) + (f", ... ({len(ids)} in all)" if len(ids) > SHOWN_IDS else "")


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


# -- one pass over the source as stored ------------------------------------------------------------
@dataclass
class SourceScan:
    """What one pass over a loader's source found, indexed by sample id."""

    size: int
    labels: dict[str, np.ndarray] = field(default_factory=dict)  # label key -> values of every id read
    read: np.ndarray | None = None  # bool per id: read without error
    digests: np.ndarray | None = None  # content digest per id (with_digests)
    failed: list[dict] = field(default_factory=list)  # quarantine entries
    problems: list[quality.Problem] = field(default_factory=list)
    irregular: set[str] = field(default_factory=set)  # label keys whose shape varies: not kept
    scores: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)  # (key, image check) -> score per id
    hashes: dict[str, np.ndarray] = field(default_factory=dict)  # image key -> perceptual hash per id
    hashed: dict[str, np.ndarray] = field(default_factory=dict)  # image key -> bool per id: hashed

    def store_hashes(self, ids: np.ndarray, found: dict[str, np.ndarray]) -> None:
        for key, values in found.items():
            if key not in self.hashes:
                self.hashes[key], self.hashed[key] = np.zeros(self.size, np.uint64), np.zeros(self.size, bool)
            self.hashes[key][ids], self.hashed[key][ids] = values, True

    def store_scores(self, ids: np.ndarray, found: dict[tuple[str, str], np.ndarray]) -> None:
        for name, values in found.items():
            if name not in self.scores:
                self.scores[name] = np.full(self.size, np.nan)
            self.scores[name][ids] = values

    def first_classes(self, label_keys: Sequence[str]) -> tuple[str | None, list | None]:
        """The first categorical label key and the class of every id (None where unread)."""
        for key in label_keys:
            if key in self.labels:
                classes = quality.label_classes(self.labels[key])
                if classes is not None:
                    assert self.read is not None  # labels are stored with the read mask
                    return key, [c if ok else None for c, ok in zip(classes, self.read.tolist())]
        return None, None

    def store_labels(self, key: str, ids: np.ndarray, values: np.ndarray) -> None:
        """Keep the labels of ``ids``; a key whose shape varies between samples is not kept."""
        table = self.labels.get(key)
        if key in self.irregular or (table is not None and table.shape[1:] != values.shape[1:]):
            self.irregular.add(key)
            self.labels.pop(key, None)
            return
        dtype = values.dtype if table is None else np.result_type(table, values)  # e.g. longer strings
        if table is None or dtype != table.dtype:
            grown = np.zeros((self.size,) + values.shape[1:], dtype)
            if table is not None:
                grown[:] = table
            table = self.labels[key] = grown
        table[ids] = values

    def classes(self, key: str) -> Counter | None:
        """The label histogram of ``key`` over the samples read; None when not categorical."""
        if key not in self.labels:
            return None
        classes = quality.label_classes(self.labels[key][self.read])
        return None if classes is None else Counter(classes)


class Measures:
    """The transform of a scan: each of ``parts`` (transforms that add measured keys) in turn,
    so the scan's workers compute them. Picklable when its parts are."""

    def __init__(self, parts: Sequence[Callable]):
        self.parts = tuple(parts)

    def __call__(self, sample: dict, rng=None) -> dict:
        for part in self.parts:
            sample = part(sample, rng)
        return sample


def scan_source(
    loader: Loader,
    label_keys: Sequence[str],
    checks: Sequence[str] = (),
    *,
    with_digests: bool = False,
    setting: tuple[int | str | None, str] = (0, "thread"),
    bar=None,
    visit: Callable[[int, dict], None] | None = None,
    with_hashes: bool = False,
) -> SourceScan:
    """Read every sample of ``loader``'s source once, one id per read, so that what is recorded
    is ``source[id]`` even for a source whose batched read misplaces rows (see
    :func:`~steadyfeed.tools.spec.raw_loader`). ``visit(id, sample)`` sees every sample read;
    ``bar`` (a progress bar) advances by one per sample."""
    n = len(loader.source)
    scan = SourceScan(n, read=np.zeros(n, bool), digests=np.zeros(n, "S16") if with_digests else None)
    assert scan.read is not None  # made just above
    scored = quality.image_checks(checks)
    parts = ([image_quality.ScoreTransform(scored)] if scored else []) + (
        [near_duplicates.HashTransform()] if with_hashes else []
    )
    transform = Measures(parts) if parts else None  # run by the workers
    with raw_loader(loader, batch_size=1, workers=setting[0], mode=setting[1], transform=transform) as raw:
        for batch in raw:
            ids = batch["id"]
            scan.store_scores(ids, image_quality.take_scores(batch))
            scan.store_hashes(ids, near_duplicates.take_hashes(batch))
            scan.read[ids] = True
            for key in label_keys:
                if key in batch:
                    scan.store_labels(key, ids, batch[key])
            for i, row in batch_rows(batch):
                scan.problems += quality.sample_problems(i, row, checks)
                if with_digests:
                    assert scan.digests is not None  # made above
                    scan.digests[i] = content_digest(row, label_keys)
                if visit is not None:
                    visit(i, row)
            if bar is not None:
                bar.update(len(ids))
        scan.failed = raw.quarantine_report()
    return scan


def content_digest(sample: dict, label_keys: Sequence[str]) -> bytes:
    """16 bytes that differ between samples whose non-label keys differ (name, dtype, shape or bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(k for k in sample if k not in label_keys):
        a = np.ascontiguousarray(sample[key])
        h.update(f"{key}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.digest()


# -- the epochs, at each setting -------------------------------------------------------------------
@dataclass
class EpochRecord:
    """What one epoch delivered at one setting (all shards)."""

    epoch: int
    ids: list = field(default_factory=list)  # arrays of real-row ids, in delivery order
    digest: Any = field(default_factory=hashlib.sha256)
    error: str | None = None
    skipped: list[int] = field(default_factory=list)
    mispaired: dict[int, str] = field(default_factory=dict)  # id -> first label key that differs
    check_failed: set[int] = field(default_factory=set)
    check_error: str | None = None
    labels: Counter = field(default_factory=Counter)
    categorical: bool = True

    def all_ids(self) -> np.ndarray:
        return np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64)


class _Observer:
    """Looks at every delivered batch: digest, ids, pairing against the scan, the user's check."""

    def __init__(self, scan: SourceScan, label_keys: Sequence[str], check: Callable | None):
        self.scan, self.label_keys, self.check = scan, [k for k in label_keys if k in scan.labels], check

    def see(self, rec: EpochRecord, batch: dict) -> None:
        for key in sorted(batch):
            rec.digest.update(key.encode())
            rec.digest.update(np.ascontiguousarray(batch[key]).tobytes())
        real = real_rows(batch)
        ids = batch["id"][real]
        rec.ids.append(ids)
        known = (ids >= 0) & (ids < self.scan.size)
        assert self.scan.read is not None  # every scan records what it read
        known[known] &= self.scan.read[ids[known]]
        for key in self.label_keys:
            self._pairing(rec, key, batch[key][real][known] if key in batch else None, ids[known])
        if self.label_keys and rec.categorical and self.label_keys[0] in batch:
            classes = quality.label_classes(batch[self.label_keys[0]][real])
            rec.categorical = classes is not None
            rec.labels.update(classes or [])
        if self.check is not None:
            self._user_check(rec, batch, real, ids)

    def _pairing(self, rec: EpochRecord, key: str, delivered: np.ndarray | None, ids: np.ndarray) -> None:
        if not len(ids):
            return
        stored = self.scan.labels[key][ids]
        if delivered is None or delivered.shape != stored.shape:
            bad = ids
        else:
            same = (delivered == stored) | ((delivered != delivered) & (stored != stored))  # NaN == NaN here
            bad = ids[~same.reshape(len(ids), -1).all(axis=1)]
        for i in bad.tolist():
            rec.mispaired.setdefault(i, key)

    def _user_check(self, rec: EpochRecord, batch: dict, real: np.ndarray, ids: np.ndarray) -> None:
        assert self.check is not None  # called when there is a check
        try:
            verdict = np.asarray(self.check(batch))
            if verdict.shape == ():
                ok = np.full(len(real), bool(verdict))
            elif verdict.shape == real.shape:
                ok = verdict.astype(bool)
            else:
                raise ValueError(f"returned shape {verdict.shape}; expected a bool or one bool per row ({len(real)})")
        except Exception as exc:  # a broken check fails the check, and says why
            rec.check_error = rec.check_error or _error_text(exc)
            ok = np.zeros(len(real), bool)
        rec.check_failed.update(ids[~ok[real]].tolist())


def _run_setting(loader: Loader, setting: tuple[int, str], epochs: int, observer: _Observer, bar) -> list[EpochRecord]:
    records = [EpochRecord(e) for e in range(epochs)]
    for shard in range(loader.config.sharding.shard_count):
        with at_setting(loader, *setting, shard_index=shard) as run:
            for rec in records:
                bar.set_description(f"audit: {setting_label(*setting)}, epoch {rec.epoch}")
                if rec.error is None:
                    try:
                        for batch in run.epoch(rec.epoch):
                            observer.see(rec, batch)
                            bar.update(len(batch["id"]))
                    except Exception as exc:  # recorded; the other epochs and settings still run
                        rec.error = _error_text(exc)
            for entry in run.quarantine_report():
                records[entry["epoch"]].skipped.append(entry["sample_id"])
    return records


# -- the audit -------------------------------------------------------------------------------------
def audit(
    loader: Loader,
    *,
    epochs: int = 2,
    settings: Sequence[tuple[int, str]] = DEFAULT_SETTINGS,
    check: Callable | None = None,
    against: Loader | None = None,
    label_keys: Sequence[str] = ("y",),
    checks: Sequence[str] = (),
    drift_threshold: float = quality.DRIFT_THRESHOLD,
    thresholds: dict[str, float] | None = None,
    near_duplicates: int | None = None,
    target: str = "",
    progress: bool = False,
) -> AuditReport:
    """Audit ``loader`` (see the module docstring); ``progress`` shows a tqdm bar on stderr;
    ``thresholds`` (image check -> value) replace the robust ones; ``near_duplicates`` (bits)
    looks for near-identical images within the split and across it and ``against``."""
    if epochs < 1 or not settings:
        raise ValueError("an audit needs epochs >= 1 and at least one setting")
    checks = quality.check_names(checks)
    settings = list(dict.fromkeys((int(w), m) for w, m in settings))  # a setting named twice runs once
    n = len(loader.source)
    total = n * (1 + len(settings) * epochs) + (len(against.source) if against is not None else 0)
    with progress_bar(total, "audit: reading the source", unit=" samples", enabled=progress) as bar:
        hashing = near_duplicates is not None
        scan = scan_source(
            loader,
            label_keys,
            checks,
            with_digests=against is not None,
            setting=settings[0],
            bar=bar,
            with_hashes=hashing,
        )
        other = None
        if against is not None:
            bar.set_description("audit: reading --against")
            other = scan_source(
                against, label_keys, with_digests=True, setting=settings[0], bar=bar, with_hashes=hashing
            )
        observer = _Observer(scan, label_keys, check)
        runs = {setting_label(*s): _run_setting(loader, s, epochs, observer, bar) for s in settings}
    findings = image_findings(scan, loader, label_keys, thresholds)
    results = [_readable(scan, loader.excluded_ids(0)), *_quality(scan, checks), *_image_quality(findings)]
    results += [_delivery(rec, loader, label) for label, records in runs.items() for rec in records]
    results += [_reproducible(runs), _pairing(runs, observer.label_keys, label_keys)]
    if check is not None:
        results.append(_checked(runs, getattr(check, "__name__", "check")))
    results.append(_epoch_drift(next(iter(runs.values())), drift_threshold))
    if other is not None:
        results += [_contamination(scan, other), _split_drift(scan, other, label_keys, drift_threshold)]
    if hashing and near_duplicates is not None:  # the same test: mypy narrows on this one
        pairs = duplicate_findings(scan, other, loader, against, near_duplicates)
        results += _near_duplicates(pairs, scan, other, near_duplicates)
        findings["duplicates"] = pairs
    if loader.excluded():
        findings["excluded"] = loader.excluded()
    return AuditReport(target or repr(loader), len(loader.source), epochs, list(runs), repr(loader), results, findings)


# -- one function per check --------------------------------------------------------------------------
def _readable(scan: SourceScan, excluded: np.ndarray) -> CheckResult:
    """Samples the loader excludes from the first epoch on may fail to read: it never reads them."""
    if not scan.failed:
        return CheckResult("readable", PASS, f"all {scan.size} samples read without error")
    failing = [e for e in scan.failed if not np.isin(e["sample_id"], excluded)]
    if not failing:
        return CheckResult(
            "readable",
            PASS,
            f"{len(scan.failed)} sample(s) failed to read, all excluded by the "
            f"loader: ids {_shown(e['sample_id'] for e in scan.failed)}",
            details={"failed": scan.failed[:LISTED_IDS]},
        )
    first = failing[0]
    where = f" ({first['location']})" if first["location"] else ""
    return CheckResult(
        "readable",
        FAIL,
        f"{len(failing)} sample(s) failed to read: ids "
        f"{_shown(e['sample_id'] for e in failing)}; first{where}: {first['error_type']}: "
        f"{first['message'].splitlines()[0] if first['message'] else ''}",
        details={"failed": scan.failed[:LISTED_IDS]},
    )


def _quality(scan: SourceScan, checks: Sequence[str]) -> list[CheckResult]:
    out = []
    for name in (c for c in checks if c in quality.CHECKS):
        found = [p for p in scan.problems if p.check == name]
        summary = (
            f"no sample fails {name!r}"
            if not found
            else f"{len({p.sample_id for p in found})} sample(s) fail: ids {_shown(p.sample_id for p in found)}; "
            f"first: {found[0]}"
        )
        out.append(
            CheckResult(
                f"quality:{name}",
                FAIL if found else PASS,
                summary,
                details={"problems": [p.as_dict() for p in found[:LISTED_IDS]]},
            )
        )
    return out


def image_findings(scan: SourceScan, loader: Loader, label_keys: Sequence[str], given: dict[str, float] | None) -> dict:
    """``{"quality": ...}`` from the scan's image scores (nothing when no image check ran):
    the image key scored most often is the one judged."""
    if not scan.scores:
        return {}
    counts = {key: int(np.isfinite(values).sum()) for (key, _), values in scan.scores.items()}
    key = max(sorted(counts), key=lambda k: counts[k])
    scores = {check: values for (k, check), values in scan.scores.items() if k == key}
    _, classes = scan.first_classes(label_keys)
    return {
        "quality": image_quality.findings(
            np.arange(scan.size),
            scores,
            labels=classes,
            given=given,
            key=key,
            locate=lambda i: locate(loader.source, i),
        )
    }


def _hashed(scan: SourceScan) -> tuple[np.ndarray, np.ndarray]:
    """(ids, hashes) of the image key hashed most often (none: two empty arrays)."""
    if not scan.hashes:
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    key = max(sorted(scan.hashed), key=lambda k: int(scan.hashed[k].sum()))
    ids = np.flatnonzero(scan.hashed[key])
    return ids, scan.hashes[key][ids]


def duplicate_findings(
    scan: SourceScan, other: SourceScan | None, loader: Loader, against: Loader | None, max_distance: int
) -> list[dict]:
    """The ``"duplicates"`` section: pairs within the split, then pairs across it and ``other``."""
    ids, hashes = _hashed(scan)
    where = lambda i: locate(loader.source, i)  # noqa: E731 - a name for the findings' files
    found = near_duplicates.findings(ids, near_duplicates.find(hashes, max_distance=max_distance), locate=where)
    if other is not None:
        other_ids, other_hashes = _hashed(other)
        found += near_duplicates.findings(
            ids,
            near_duplicates.find(hashes, other_hashes, max_distance),
            other_ids=other_ids,
            split_a="audited",
            split_b="against",
            locate=where,
            locate_other=None if against is None else lambda i: locate(against.source, i),
        )
    return found


def _near_duplicates(
    pairs: list[dict], scan: SourceScan, other: SourceScan | None, max_distance: int
) -> list[CheckResult]:
    out = []
    for name, across, what in (
        ("near_duplicates", False, "within the split"),
        ("near_contamination", True, "across the split and --against"),
    ):
        if across and other is None:
            continue
        mine = [p for p in pairs if ("split_b" in p) == across]
        hashed = int(sum(h.sum() for h in scan.hashed.values()))
        shown = "; ".join(f"{p['a']}~{p['b']} ({p['distance']} bits)" for p in mine[:SHOWN_IDS])
        summary = (
            f"{len(mine)} pair(s) of near-identical images {what} (within {max_distance} bits): {shown}"
            f"{' ...' if len(mine) > SHOWN_IDS else ''}"
            if mine
            else f"no two images {what} within {max_distance} bits ({hashed} hashed)"
            if hashed
            else "no image to hash"
        )
        out.append(
            CheckResult(
                name,
                FAIL if mine else PASS if hashed else SKIP,
                summary,
                details={"max_distance": max_distance, "pairs": mine[:LISTED_IDS], "count": len(mine)},
            )
        )
    return out


def _image_quality(findings: dict) -> list[CheckResult]:
    out = []
    for name, check in findings.get("quality", {}).get("checks", {}).items():
        flagged, side = check["flagged"], "below" if check["direction"] == "low" else "above"
        summary = (
            f"{len(flagged)} of {check['scored']} images {side} the {check['source']} threshold "
            f"{check['threshold']:.4g} (median {check['median']:.4g})"
            if check["scored"]
            else "no image was scored"
        )
        if flagged:
            summary += f": ids {_shown(f['id'] for f in flagged)}"
        out.append(
            CheckResult(
                f"quality:{name}",
                FAIL if flagged else PASS if check["scored"] else SKIP,
                summary,
                details={k: v if k != "flagged" else v[:LISTED_IDS] for k, v in check.items()},
            )
        )
    return out


def expected_count(n: int, batch_size: int, shard_count: int, last_batch: str) -> int:
    """Samples an epoch delivers over all shards, by the documented rules (see sampling/plan.py)."""
    if last_batch == "drop":
        return shard_count * ((n // shard_count) // batch_size) * batch_size
    return n


def _delivery(rec: EpochRecord, loader: Loader, setting: str) -> CheckResult:
    n, read = len(loader.source), loader.config.read
    ids = rec.all_ids()
    out_of_range = ids[(ids < 0) | (ids >= n)]
    counts = np.bincount(ids[(ids >= 0) & (ids < n)], minlength=n)
    excluded = loader.excluded_ids(rec.epoch)
    excluded_delivered = excluded[counts[excluded] > 0]
    details = {
        "delivered": int(len(ids)),
        "out_of_range": _idlist(out_of_range),
        "skipped": _idlist(rec.skipped),
        "excluded": _idlist(excluded),
        "error": rec.error,
    }
    if isinstance(loader.sampler, WeightedSampler):
        problems = _problems(
            out_of_range=out_of_range, excluded_but_delivered=excluded_delivered, skipped=rec.skipped, error=rec.error
        )
        return CheckResult(
            "ids_in_range",
            FAIL if problems else PASS,
            problems or f"{len(ids)} ids, all in range (weighted sampler: repeats and omissions are by design)",
            setting,
            rec.epoch,
            details,
        )
    expected = expected_count(n - len(excluded), read.batch_size, loader.config.sharding.shard_count, read.last_batch)
    dropping = read.last_batch == "drop"
    duplicated = np.flatnonzero(counts > 1)
    missing: Sequence[int] | np.ndarray = (
        [] if dropping or rec.error else np.setdiff1d(np.flatnonzero(counts == 0), np.union1d(rec.skipped, excluded))
    )
    details.update(expected=expected, duplicated=_idlist(duplicated), missing=_idlist(missing))
    problems = _problems(
        missing=missing,
        duplicated=duplicated,
        excluded_but_delivered=excluded_delivered,
        out_of_range=out_of_range,
        skipped=rec.skipped,
        error=rec.error,
        count=(
            f"{len(ids)} delivered, the drop rule keeps {expected}"
            if dropping and len(ids) != expected and not rec.error
            else None
        ),
    )
    kept = f", {n - len(excluded) - expected} dropped by last_batch='drop'" if dropping else ""
    kept += f", {len(excluded)} excluded" if len(excluded) else ""
    return CheckResult(
        "exactly_once",
        FAIL if problems else PASS,
        problems or f"{len(ids)} ids, each once{kept}",
        setting,
        rec.epoch,
        details,
    )


def _problems(*, error=None, count=None, **id_lists) -> str:
    """A summary of what is wrong ("" when nothing is)."""
    parts = [f"{name.replace('_', ' ')} {len(ids)} ({_shown(ids)})" for name, ids in id_lists.items() if len(ids)]
    parts += [count] if count else []
    parts += [f"epoch stopped by {error}"] if error else []
    return "; ".join(parts)


def _reproducible(runs: dict[str, list[EpochRecord]]) -> CheckResult:
    labels = list(runs)
    if len(labels) < 2:
        return CheckResult("reproducible", SKIP, "one setting: nothing to compare")
    differ, compared = [], 0
    for e, ref in enumerate(runs[labels[0]]):
        for label in labels[1:]:
            rec = runs[label][e]
            if ref.error or rec.error:
                continue
            compared += 1
            if rec.digest.digest() != ref.digest.digest():
                differ.append({"epoch": e, "setting": label, "reference": labels[0]})
    if differ:
        shown = "; ".join(f"epoch {d['epoch']}: {d['setting']} differs from {d['reference']}" for d in differ[:4])
        return CheckResult(
            "reproducible",
            FAIL,
            f"{shown}{' ...' if len(differ) > 4 else ''} (a transform that uses global randomness instead of its rng?)",
            details={"differ": differ},
        )
    return CheckResult(
        "reproducible",
        PASS if compared else SKIP,
        f"every epoch bit-identical at all {len(labels)} settings"
        if compared
        else "no epoch completed at two settings",
        details={"differ": []},
    )


def _where(runs: dict[str, list[EpochRecord]], has: Callable[[EpochRecord], Any]) -> tuple[set, list[str]]:
    """The ids a per-epoch finding names, over all runs, and where they were seen."""
    ids, where = set(), []
    for label, records in runs.items():
        for rec in records:
            found = has(rec)
            if found:
                ids |= set(found)
                where.append(f"{label} epoch {rec.epoch}")
    return ids, where


def _pairing(runs: dict[str, list[EpochRecord]], present: list[str], label_keys: Sequence[str]) -> CheckResult:
    if not present:
        return CheckResult("pairing", SKIP, f"the source's samples have no label key {', '.join(label_keys)}")
    ids, where = _where(runs, lambda rec: rec.mispaired)
    rows = sum(len(i) for records in runs.values() for rec in records for i in rec.ids)
    details = {"keys": present, "mispaired": _idlist(ids), "where": where}
    if not rows:
        return CheckResult("pairing", SKIP, "no row was delivered", details=details)
    if ids:
        return CheckResult(
            "pairing",
            FAIL,
            f"{len(ids)} sample(s) delivered with other labels than source[id]'s "
            f"({', '.join(present)}): ids {_shown(ids)}; in {', '.join(where[:3])}",
            details=details,
        )
    return CheckResult(
        "pairing", PASS, f"{', '.join(present)} of all {rows} delivered rows equal source[id]'s", details=details
    )


def _checked(runs: dict[str, list[EpochRecord]], name: str) -> CheckResult:
    ids, where = _where(runs, lambda rec: rec.check_failed)
    error = next((rec.check_error for records in runs.values() for rec in records if rec.check_error), None)
    details = {"function": name, "failed": _idlist(ids), "where": where, "error": error}
    if ids or error:
        said = f"; the check raised {error}" if error else ""
        return CheckResult(
            "check", FAIL, f"{name}: {len(ids)} sample(s) fail: ids {_shown(ids)}{said}", details=details
        )
    return CheckResult("check", PASS, f"{name}: every delivered row passes", details=details)


def _epoch_drift(records: list[EpochRecord], threshold: float) -> CheckResult:
    done = [r for r in records if r.error is None]
    why = (
        f"needs 2+ completed epochs, {len(done)} completed"
        if len(done) < 2
        else "the labels are not categorical (integer, bool or string classes, or one-hot rows)"
        if not all(r.categorical for r in done)
        else "no label key was delivered"
        if not done[0].labels
        else None
    )
    if why is not None:
        return CheckResult("label_drift_epochs", SKIP, why)
    records = done
    distances = {r.epoch: quality.total_variation(records[0].labels, r.labels) for r in records[1:]}
    worst = max(distances, key=lambda epoch: distances[epoch])
    status = FAIL if distances[worst] > threshold else PASS
    return CheckResult(
        "label_drift_epochs",
        status,
        f"largest total variation from epoch {records[0].epoch}: "
        f"{distances[worst]:.3f} "
        f"(epoch {worst}), threshold {threshold}",
        details={"distances": distances, "threshold": threshold},
    )


def _split_drift(scan: SourceScan, other: SourceScan, label_keys: Sequence[str], threshold: float) -> CheckResult:
    key = next((k for k in label_keys if scan.classes(k) is not None and other.classes(k) is not None), None)
    if key is None:
        return CheckResult("label_drift_splits", SKIP, "needs categorical labels on both sides")
    mine, theirs = scan.classes(key), other.classes(key)
    assert mine is not None and theirs is not None  # the key was chosen for having both
    distance = quality.total_variation(mine, theirs)
    return CheckResult(
        "label_drift_splits",
        FAIL if distance > threshold else PASS,
        f"total variation between the {key!r} histograms: {distance:.3f}, threshold {threshold}",
        details={
            "key": key,
            "distance": distance,
            "threshold": threshold,
            "histogram": {str(k): v for k, v in sorted(mine.items(), key=str)},
            "against_histogram": {str(k): v for k, v in sorted(theirs.items(), key=str)},
        },
    )


def _contamination(scan: SourceScan, other: SourceScan) -> CheckResult:
    assert scan.read is not None and scan.digests is not None  # scanned with digests, as is other
    assert other.read is not None and other.digests is not None
    mine, theirs = scan.digests[scan.read], other.digests[other.read]
    shared = np.intersect1d(mine, theirs)
    ids = np.flatnonzero(scan.read & np.isin(scan.digests, shared))
    other_ids = np.flatnonzero(other.read & np.isin(other.digests, shared))
    details = {"ids": _idlist(ids), "against_ids": _idlist(other_ids)}
    if len(shared):
        return CheckResult(
            "contamination",
            FAIL,
            f"{len(ids)} sample(s) share their content with {len(other_ids)} "
            f"of the other split: ids {_shown(ids)} ~ against ids {_shown(other_ids)}",
            details=details,
        )
    return CheckResult(
        "contamination",
        PASS,
        f"no content shared between the {int(scan.read.sum())} and {int(other.read.sum())} samples read",
        details=details,
    )
