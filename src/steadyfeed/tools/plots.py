"""Pictures of a ``steadyfeed bench`` report, drawn with matplotlib's Agg backend.

Works from the report's JSON form (``Report.as_dict()``, or ``steadyfeed bench --json``
saved to a file), so a saved run can be drawn again later. matplotlib is imported only
here, only when a plot is asked for, and through a ``Figure`` with an Agg canvas rather
than pyplot: no global backend is chosen or changed, so this is safe in a notebook,
in threads and without a display.

What is drawn: samples/s per setting (the median run, the range of the runs as an error
bar; the recommended setting, or the tied ones, highlighted; failed settings grey at 0;
the axis starts at 0), and, for each setting that has a queue (workers > 0: inline has
none), its queue fill over the measured window, one panel per setting stacked on one
shared time axis, so no line hides another.
"""

from __future__ import annotations

import os

FAILED_COLOR = "#bbbbbb"
CHOSEN_COLOR = "#d95f02"
OTHER_COLOR = "#1b9e77"


def queued(report: dict) -> list[dict]:
    """The settings that have a queue to draw: workers, a successful run, a timeline."""
    return [s for s in report["settings"] if s["workers"] > 0 and s["ok"] and s["queue"]["timeline"]]


def bench_figure(report: dict):
    """Throughput per setting on the left; on the right one queue panel per setting with a
    queue (see the module docstring), sharing their time axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = queued(report)
    fig = Figure(figsize=(11, max(4.5, 1.6 * len(panels))), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(max(len(panels), 1), 2, width_ratios=(2, 3))
    _draw_throughput(fig.add_subplot(grid[:, 0]), report)
    first = None
    for row, setting in enumerate(panels):
        ax = fig.add_subplot(grid[row, 1], sharex=first)
        first = first or ax
        _draw_queue(ax, setting, last=row == len(panels) - 1)
    return fig


def _highlighted(report: dict) -> set[str]:
    rec = report.get("recommendation") or {}
    return set(rec.get("tied") or []) or ({rec["label"]} if rec.get("label") else set())


def _draw_throughput(ax, report: dict) -> None:
    settings, chosen = report["settings"], _highlighted(report)
    labels = [s["label"] for s in settings]
    medians = [s["samples_per_second"] if s["ok"] else 0.0 for s in settings]
    runs = [s.get("runs") or [m] for s, m in zip(settings, medians)]
    errors = [
        [m - min(r) if s["ok"] else 0 for s, m, r in zip(settings, medians, runs)],
        [max(r) - m if s["ok"] else 0 for s, m, r in zip(settings, medians, runs)],
    ]
    colors = [FAILED_COLOR if not s["ok"] else CHOSEN_COLOR if s["label"] in chosen else OTHER_COLOR for s in settings]
    bars = ax.bar(labels, medians, color=colors, yerr=errors, capsize=3)
    ax.bar_label(bars, labels=["failed" if not s["ok"] else f"{m:,.0f}" for s, m in zip(settings, medians)], fontsize=8)
    ax.set_ylim(0, max([max(r) for r in runs] + [1.0]) * 1.15)  # never below 0, also when every setting failed
    ax.set_ylabel("samples / s (median run; bars: range of runs)")
    rec = report.get("recommendation") or {}
    what = (
        "tie: " + ", ".join(rec["tied"])
        if rec.get("verdict") == "tie"
        else f"recommended: {rec['label']}"
        if rec
        else ""
    )
    ax.set_title("throughput" + (f" ({what})" if what else ""))
    ax.tick_params(axis="x", labelrotation=30)


def _draw_queue(ax, setting: dict, last: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    t, ready = zip(*setting["queue"]["timeline"])
    ax.step(t, ready, where="post", color=OTHER_COLOR)
    ax.set_xlim(left=0)
    ax.set_ylim(0, setting["queue"]["prefetch"] + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of batches
    ax.set_title(
        f"{setting['label']}: batches ready when one is taken (prefetch {setting['queue']['prefetch']})", fontsize=9
    )
    if last:
        ax.set_xlabel("seconds since the measured window began")
    else:
        ax.tick_params(labelbottom=False)


def save_bench_plot(report: dict, path: str | os.PathLike) -> None:
    """Write ``bench_figure(report)`` as a PNG to ``path``."""
    bench_figure(report).savefig(path, format="png", dpi=100)
