"""One self-contained HTML page of a run's findings: what a person looks at.

    from steadyfeed.diagnostics import report
    report.write("report.html", findings, sources={"train": train_source, "val": val_source})

``steadyfeed report FINDINGS.json -o report.html [SPEC]`` and ``steadyfeed audit ... --report
report.html`` write the same page. Sections, each present when its findings are (their shape is
in :mod:`steadyfeed.diagnostics`): the **suspected mislabels** (thumbnail, given vs predicted
label, score) with the AUM histogram and the noise-rate estimate, each **image-quality** check's
flagged images (blurriest, darkest, ... as the findings rank them) with a per-class table and
plot, the **duplicate pairs** side by side, the **quarantine** table and the **excluded** ids.

Guarantees:

* **one file**: every image is inline (``data:`` URIs: thumbnails as PNG made with Pillow, plots
  as PNG drawn by matplotlib's Agg canvas, no global backend chosen); no script, no stylesheet
  or font fetched from anywhere, so it opens offline, from a mail attachment, in CI artifacts;
* **escaped**: every string that comes from data (ids, labels, file paths, error messages,
  reasons, class names) is HTML-escaped, so a file named ``<script>.png`` is text on the page;
* **thumbnails** come from ``sources`` (``{split: source}``; a finding's split is its
  ``split``/``split_a``/``split_b``, else the first source), the sample's ``image_key`` array
  (H x W, H x W x C, C x H x W, or a flat vector of a square number of pixels, e.g. 8 x 8 digits;
  floats scaled to their own range), else the finding's ``file`` read with Pillow; where neither
  works the cell says why, in text. Pillow and matplotlib are imported only here, when writing.
* at most ``rows`` entries per table (the page says how many were left out).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..files import atomic_write

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:middle;font-size:.9em}th{background:#f4f4f4}.num{text-align:right;font-variant-numeric:tabular-nums}
img.thumb{image-rendering:pixelated;border:1px solid #ccc}.grid{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:0;text-align:center;font-size:.8em;width:130px}.note{color:#666;font-size:.9em}.missing{color:#a00}
.summary td{border:none;padding:2px 12px 2px 0}
"""


@dataclass(frozen=True)
class ReportOptions:
    """What the page shows.

    * ``title``: the page's title;
    * ``rows``: entries listed per table or grid at most;
    * ``thumbnail``: the longer side of a thumbnail, in pixels;
    * ``image_key``: the sample key holding the image, for thumbnails from sources;
    * ``class_names``: names of the class indices (given / predicted labels), if known.
    """

    title: str = "steadyfeed report"
    rows: int = 60
    thumbnail: int = 96
    image_key: str = "x"
    class_names: Sequence[str] | None = None

    def __post_init__(self):
        if self.rows < 1 or self.thumbnail < 8:
            raise ValueError(f"rows must be >= 1 and thumbnail >= 8, got {self.rows}, {self.thumbnail}")


def write(
    path: str | os.PathLike,
    findings: Mapping,
    *,
    sources: Mapping[str, Any] | None = None,
    options: ReportOptions = ReportOptions(),
) -> None:
    """Write ``render(findings, ...)`` to ``path`` (atomically)."""
    atomic_write(path, render(findings, sources=sources, options=options).encode("utf-8"))


def render(
    findings: Mapping, *, sources: Mapping[str, Any] | None = None, options: ReportOptions = ReportOptions()
) -> str:
    """The page, as a string (see the module docstring)."""
    page = _Page(findings, dict(sources or {}), options)
    body = [
        f"<h1>{_e(options.title)}</h1>",
        page.summary(),
        page.label_noise(),
        page.quality(),
        page.duplicates(),
        page.quarantine(),
        page.excluded(),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(options.title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body></html>\n"
    )


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return _e(value)


class _Page:
    def __init__(self, findings: Mapping, sources: dict, options: ReportOptions):
        self.f, self.sources, self.o = findings, sources, options
        self.default_split = next(iter(sources), None)

    # -- sections ---------------------------------------------------------------------------------
    def summary(self) -> str:
        rows = []
        noise = self.f.get("label_noise") or {}
        if noise:
            rate = noise.get("noise_rate") or {}
            said = (
                f"{100 * rate['estimate']:.1f}% estimated label noise "
                f"({100 * rate['low']:.1f}-{100 * rate['high']:.1f}%)"
                if rate
                else "no estimate"
            )
            rows.append(("suspected mislabels", f"{len(noise.get('suspects', []))}; {said}"))
        for name, check in ((self.f.get("quality") or {}).get("checks") or {}).items():
            rows.append((f"quality: {name}", f"{len(check.get('flagged', []))} flagged"))
        for key, what in (
            ("duplicates", "duplicate pairs"),
            ("quarantine", "quarantined samples"),
            ("excluded", "excluded samples"),
        ):
            if key in self.f:
                rows.append((what, str(len(self.f[key] or []))))
        if not rows:
            return '<p class="note">No findings.</p>'
        cells = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td></tr>" for a, b in rows)
        return f'<table class="summary" id="summary">{cells}</table>'

    def label_noise(self) -> str:
        noise = self.f.get("label_noise")
        if not noise:
            return ""
        rate = noise.get("noise_rate") or {}
        parts = ['<section id="label-noise"><h2>Suspected mislabels</h2>']
        if rate:
            parts.append(
                f"<p>Estimated label-noise rate: <b>{100 * rate['estimate']:.1f}%</b> "
                f"({100 * rate.get('confidence', 0.95):.0f}% interval {100 * rate['low']:.1f}-"
                f"{100 * rate['high']:.1f}%; {_e(rate.get('method', ''))}); threshold "
                f"{_num(noise.get('threshold'))}, {_e(noise.get('samples', ''))} samples, "
                f"up to {_e(noise.get('max_records', ''))} records each.</p>"
            )
        if noise.get("aum_histogram"):
            parts.append(self._plot(_aum_figure, noise, "the distribution of AUM, with the threshold"))
        suspects = noise.get("suspects") or []
        cards = [
            f'<figure class="suspect">{self._thumb(s.get("id"), s.get("split"), s.get("file"))}'
            f"<figcaption>id {_e(s.get('id'))}<br>given <b>{_e(self._label(s.get('given')))}</b>, "
            f"predicted <b>{_e(self._label(s.get('predicted')))}</b><br>score {_num(s.get('score'))}"
            + (f", loss {_num(s.get('loss'))}" if s.get("loss") is not None else "")
            + "</figcaption></figure>"
            for s in suspects[: self.o.rows]
        ]
        parts.append(self._grid("suspects", cards, len(suspects)))
        return "".join(parts) + "</section>"

    def quality(self) -> str:
        quality = self.f.get("quality")
        if not quality:
            return ""
        parts = ['<section id="quality"><h2>Image quality</h2>']
        for name, check in (quality.get("checks") or {}).items():
            flagged = check.get("flagged") or []
            figures = [
                f"<figure>{self._thumb(item.get('id'), item.get('split'), item.get('file'))}"
                f"<figcaption>id {_e(item.get('id'))}<br>score {_num(item.get('score'))}"
                + (f"<br>class {_e(self._label(item['label']))}" if item.get("label") is not None else "")
                + (f"<br>{_e(item['reason'])}" if item.get("reason") else "")
                + "</figcaption></figure>"
                for item in flagged[: self.o.rows]
            ]
            parts.append(
                f'<h3>{_e(name)}</h3><p class="note">{len(flagged)} flagged; threshold '
                f"{_num(check.get('threshold'))}</p>" + self._grid("quality", figures, len(flagged))
            )
        per_class = quality.get("per_class") or {}
        if per_class:
            names = sorted({n for counts in per_class.values() for n in counts})
            head = "<tr><th>class</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"
            rows = [
                "<tr><td>"
                + _e(self._label(label))
                + "</td>"
                + "".join(f'<td class="num">{_e(counts.get(n, 0))}</td>' for n in names)
                + "</tr>"
                for label, counts in per_class.items()
            ]
            parts.append(self._table("per-class", head, rows, len(rows)))
            parts.append(self._plot(_per_class_figure, per_class, "flagged images per class and check"))
        return "".join(parts) + "</section>"

    def duplicates(self) -> str:
        if "duplicates" not in self.f:
            return ""
        pairs = self.f["duplicates"] or []
        head = "<tr><th>a</th><th></th><th>b</th><th></th><th>distance</th></tr>"
        rows = [
            f"<tr><td>{self._thumb(p.get('a'), p.get('split_a'), p.get('a_file'))}</td>"
            f"<td>{_e(p.get('split_a') or '')} id {_e(p.get('a'))}<br>{_e(p.get('a_file') or '')}</td>"
            f"<td>{self._thumb(p.get('b'), p.get('split_b'), p.get('b_file'))}</td>"
            f"<td>{_e(p.get('split_b') or '')} id {_e(p.get('b'))}<br>{_e(p.get('b_file') or '')}</td>"
            f'<td class="num">{_num(p.get("distance"))}</td></tr>'
            for p in pairs[: self.o.rows]
        ]
        return (
            '<section id="duplicates"><h2>Duplicate pairs</h2>'
            + self._table("pairs", head, rows, len(pairs))
            + "</section>"
        )

    def quarantine(self) -> str:
        if "quarantine" not in self.f:
            return ""
        entries = self.f["quarantine"] or []
        head = "<tr><th>id</th><th>file</th><th>epoch</th><th>attempts</th><th>error</th></tr>"
        rows = [
            f'<tr><td class="num">{_e(q.get("id"))}</td><td>{_e(q.get("file") or "")}</td>'
            f'<td class="num">{_e(q.get("epoch", ""))}</td><td class="num">{_e(q.get("attempt", ""))}</td>'
            f"<td>{_e(q.get('error'))}</td></tr>"
            for q in entries[: self.o.rows]
        ]
        return (
            '<section id="quarantine"><h2>Quarantine</h2>'
            + self._table("quarantined", head, rows, len(entries))
            + "</section>"
        )

    def excluded(self) -> str:
        if "excluded" not in self.f:
            return ""
        entries = self.f["excluded"] or []
        head = "<tr><th>id</th><th>reason</th></tr>"
        rows = [
            f'<tr><td class="num">{_e(x.get("id"))}</td><td>{_e(x.get("reason"))}</td></tr>'
            for x in entries[: self.o.rows]
        ]
        return (
            '<section id="excluded"><h2>Excluded</h2>'
            + self._table("excluded-ids", head, rows, len(entries))
            + "</section>"
        )

    # -- pieces -------------------------------------------------------------------------------------
    def _table(self, name: str, head: str, rows: list[str], total: int) -> str:
        if not total:
            return '<p class="note">None.</p>'
        more = total - len(rows)
        return f'<table class="{_e(name)}">{head}{"".join(rows)}</table>' + (
            f'<p class="note">{more} more not shown</p>' if more > 0 else ""
        )

    def _grid(self, name: str, figures: list[str], total: int) -> str:
        if not total:
            return '<p class="note">None.</p>'
        more = total - len(figures)
        return f'<div class="grid {_e(name)}">{"".join(figures)}</div>' + (
            f'<p class="note">{more} more not shown</p>' if more > 0 else ""
        )

    def _label(self, label: Any) -> Any:
        names = self.o.class_names
        if names is not None and isinstance(label, int) and 0 <= label < len(names):
            return f"{names[label]} ({label})"
        return label

    def _thumb(self, sample_id: Any, split: str | None, file: str | None) -> str:
        try:
            png = self._thumbnail_png(sample_id, split, file)
        except Exception as exc:  # one unreadable image never stops the page; it says why
            return f'<span class="missing">no image: {_e(type(exc).__name__)}: {_e(exc)}</span>'
        if png is None:
            return '<span class="note">no image</span>'
        return f'<img class="thumb" alt="sample {_e(sample_id)}" src="data:image/png;base64,{png}">'

    def _thumbnail_png(self, sample_id: Any, split: str | None, file: str | None) -> str | None:
        from PIL import Image

        source = self.sources.get(split or self.default_split)
        if source is not None and isinstance(sample_id, (int, np.integer)) and 0 <= sample_id < len(source):
            image = Image.fromarray(_displayable(np.asarray(source[int(sample_id)][self.o.image_key])))
        elif file:
            with Image.open(file) as opened:
                image = opened.convert("RGB")
        else:
            return None
        size = self.o.thumbnail
        scale = size / max(image.size)
        resample = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BILINEAR  # small ones stay crisp
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), resample)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    def _plot(self, draw, data: Any, alt: str) -> str:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 3.2), layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig.add_subplot(), data)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=90)
        encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
        return f'<p><img class="plot" alt="{_e(alt)}" src="data:image/png;base64,{encoded}"></p>'


def _displayable(a: np.ndarray) -> np.ndarray:
    """An array as uint8 grey (H x W) or RGB(A) (H x W x 3|4) pixels."""
    if a.ndim == 1 and a.size and math.isqrt(a.size) ** 2 == a.size:
        a = a.reshape(math.isqrt(a.size), -1)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)  # channels first
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        raise ValueError(f"shape {a.shape} is not an image")
    if a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    a = np.nan_to_num(a.astype(np.float64))
    lo, hi = float(a.min()), float(a.max())
    return np.ascontiguousarray(((a - lo) / (hi - lo if hi > lo else 1) * 255).round().astype(np.uint8))


def _aum_figure(ax, noise: Mapping) -> None:
    hist = noise["aum_histogram"]
    edges, counts = np.asarray(hist["edges"]), np.asarray(hist["counts"])
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#1b9e77")
    if noise.get("threshold") is not None:
        ax.axvline(noise["threshold"], color="#d95f02", label=f"threshold {noise['threshold']:.2f}")
        ax.legend()
    ax.set_xlabel("area under the margin (mean over epochs)")
    ax.set_ylabel("samples")


def _per_class_figure(ax, per_class: Mapping) -> None:
    labels = [str(label) for label in per_class]
    names = sorted({n for counts in per_class.values() for n in counts})
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        ax.bar(
            np.arange(len(labels)) + k * width,
            [counts.get(name, 0) for counts in per_class.values()],
            width,
            label=name,
        )
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels)
    ax.set_xlabel("class")
    ax.set_ylabel("flagged")
    ax.legend()
