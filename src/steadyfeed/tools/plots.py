"""Pictures of a ``steadyfeed bench`` report, drawn with matplotlib's Agg backend.

Works from the report's JSON form (``Report.as_dict()``, or ``steadyfeed bench --json``
saved to a file), so a saved run can be drawn again later. matplotlib is imported only
here, only when a plot is asked for, and through a ``Figure`` with an Agg canvas rather
than pyplot: no global backend is chosen or changed, so this is safe in a notebook,
in threads and without a display.
"""
from __future__ import annotations

import os

FAILED_COLOR = "#bbbbbb"
CHOSEN_COLOR = "#d95f02"
OTHER_COLOR = "#1b9e77"


def bench_figure(report: dict):
    """A figure of two subplots: samples/s per setting (bars; the recommended one
    highlighted, failed ones grey at 0) and queue fill over time (one line per setting)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    throughput, queue = fig.subplots(1, 2, width_ratios=(2, 3))
    _draw_throughput(throughput, report)
    _draw_queue(queue, report)
    return fig


def _draw_throughput(ax, report: dict) -> None:
    settings = report["settings"]
    chosen = (report.get("recommendation") or {}).get("label")
    labels = [s["label"] for s in settings]
    colors = [FAILED_COLOR if not s["ok"] else CHOSEN_COLOR if s["label"] == chosen else OTHER_COLOR
              for s in settings]
    bars = ax.bar(labels, [s["samples_per_second"] for s in settings], color=colors)
    ax.bar_label(bars, labels=["failed" if not s["ok"] else f"{s['samples_per_second']:,.0f}" for s in settings],
                 fontsize=8)
    ax.set_ylabel("samples / s")
    ax.set_title("throughput" + (f" (recommended: {chosen})" if chosen else ""))
    ax.tick_params(axis="x", labelrotation=30)


def _draw_queue(ax, report: dict) -> None:
    from matplotlib.ticker import MaxNLocator

    for s in report["settings"]:
        timeline = s["queue"]["timeline"]
        if timeline:
            t, ready = zip(*timeline)
            ax.step(t, ready, where="post", label=f"{s['label']} (prefetch {s['queue']['prefetch']})")
    ax.set_xlabel("seconds since the setting started")
    ax.set_ylabel("batches ready when one is taken")
    ax.set_ylim(0, max([s["queue"]["prefetch"] for s in report["settings"]], default=1) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of batches
    ax.set_title("queue fill over time")
    if ax.has_data():
        ax.legend(fontsize=8)


def save_bench_plot(report: dict, path: str | os.PathLike) -> None:
    """Write ``bench_figure(report)`` as a PNG to ``path``."""
    bench_figure(report).savefig(path, format="png", dpi=100)
