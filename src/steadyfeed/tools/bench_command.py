"""``steadyfeed bench SPEC``: run a loader over a grid of workers x mode and report, per
setting, samples/s, first-batch latency, time per stage, queue fill, CPU and peak memory;
then name the bottleneck and recommend a setting.

    steadyfeed bench make_data.py:loader --workers 0,1,2,4 --modes thread,process \\
        --max-batches 200 --consumer-ms 30 --plot bench.png

SPEC, the data shortcuts (--npy-pairs, --hdf5, --images, --csv, --tfrecord, ...) and the
loader options (--batch-size, --shuffle, --seed, --prefetch, ...) are those of every
steadyfeed command (``steadyfeed.tools.spec``); the grid's --workers and --modes replace
the loader's own workers and mode. ``--consumer-ms`` sleeps after each batch to stand in for a
training step, so a consumer-bound run shows a full queue. Each setting runs ``--repeat`` times
(default 3, in turns); a setting is recommended only when it beats the others by more than the
spread of their runs, else the report says which settings tie. With bad samples in the data,
``--on-error skip --max-error-fraction F`` measures the settings as training would run them
(the samples skipped are counted per setting).

Prints a table (``--json``: the report as JSON, stable keys, format ``steadyfeed.bench/2``);
progress goes to stderr. Exit code 0 when every setting ran, 1 when one failed (its error is
in the report; the other settings still run), 2 on a usage error (bad flags or SPEC).
"""

from __future__ import annotations

import argparse
import json
import os

from ..config import AUTO, MODES
from ..progress import progress_bar
from . import bench as benchmark
from .spec import SpecError, add_spec_arguments, loader_from_args, usage_error
from .tables import table

HELP = "measure a loader over workers x mode: throughput, latency, stages, queue, CPU, memory; name the bottleneck"
EXIT_CODES = (
    "exit codes: 0 every setting ran; 1 a setting failed (its error is in the report; the others "
    "still run); 2 a usage error (bad flags, a SPEC that does not load)"
)
BYTES_PER_MB = 1 << 20


def _int_list(text: str) -> list[int | str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        values: list[int | str] = [part if part == AUTO else int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (or auto), got {text!r}") from None
    if not values or any(isinstance(v, int) and v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected one or more integers >= 0 (or auto), got {text!r}")
    return values


def _mode_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(values) - set(MODES))
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return values


def _at_least(low, kind=int):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    return parse


def add_arguments(parser) -> None:
    add_spec_arguments(parser, exclude=("workers", "mode"))  # the grid's --workers and --modes replace them
    grid = parser.add_argument_group("grid (replaces the spec's workers and mode)")
    # dests unlike the loader flags': spec.loader_options() reads args.workers / args.mode when present
    grid.add_argument(
        "--workers",
        dest="grid_workers",
        type=_int_list,
        default=[0, 1, 2],
        metavar="N,N,...",
        help="worker counts to try (default 0,1,2; 0 runs in the consumer's thread, once; "
        "auto: what workers='auto' picks, and why)",
    )
    grid.add_argument(
        "--modes",
        dest="grid_modes",
        type=_mode_list,
        default=list(MODES),
        metavar="MODE,...",
        help="worker kinds to try (default thread,process)",
    )
    run = parser.add_argument_group("how long, and the consumer")
    run.add_argument("--epochs", type=_at_least(1), default=1, metavar="N", help="epochs per setting (default 1)")
    run.add_argument(
        "--max-batches",
        type=_at_least(0),
        default=100,
        metavar="N",
        help="measured batches per setting, after warm-up (default %(default)s; 0: whole epochs)",
    )
    run.add_argument(
        "--warmup",
        type=_at_least(0),
        default=2,
        metavar="N",
        help="batches left out of the measurements (default %(default)s), and after them any while "
        "the loader decides whether workers or the consumer make batches; first-batch latency, "
        "worker start-up included, is reported on its own",
    )
    run.add_argument(
        "--consumer-ms",
        type=_at_least(0, float),
        default=0.0,
        metavar="MS",
        help="sleep MS after each batch, standing in for a training step (default 0)",
    )
    run.add_argument(
        "--repeat",
        type=_at_least(1),
        default=3,
        metavar="N",
        help="runs per setting, taken in turns (default %(default)s): the report shows their median "
        "and spread, and recommends a setting only when it beats the others by more than that",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON (stable keys)")
    out.add_argument("--plot", metavar="PNG", help="draw throughput per setting and queue fill over time to PNG")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")


def run(args) -> int:
    settings = benchmark.grid(args.grid_workers, args.grid_modes)
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        return usage_error("bench", f"--plot {args.plot}: no such directory")  # before minutes of measuring
    try:
        loader = loader_from_args(args)
    except SpecError as exc:
        return usage_error("bench", exc)
    with loader:
        report = _run_grid(loader, settings, args).as_dict()
    if args.plot:
        from .plots import save_bench_plot

        save_bench_plot(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if any(not s["ok"] for s in report["settings"]) else 0


def _run_grid(loader, settings, args) -> benchmark.Report:
    per_run = args.epochs * len(loader)  # at most; a run may stop earlier (see bench._drive)
    if args.max_batches:
        per_run = min(per_run, args.warmup + benchmark.WARMUP_WHILE_DECIDING + args.max_batches)
    done = 0
    with progress_bar(per_run * len(settings) * args.repeat, "bench", unit=" batches", enabled=args.progress) as bar:

        def on_run(setting: benchmark.Setting, round_: int) -> None:
            nonlocal done  # redrawn once per run: a fast one may never reach tqdm's own refresh
            bar.set_description(f"bench {setting.label}" + (f" (run {round_ + 1})" if args.repeat > 1 else ""))
            start = (round_ * len(settings) + settings.index(setting)) * per_run  # past what earlier runs left
            bar.update(max(0, start - done))
            done = max(done, start)

        def on_batch(setting: benchmark.Setting) -> None:
            nonlocal done
            bar.update()
            done += 1

        return benchmark.bench(
            loader,
            settings,
            epochs=args.epochs,
            max_batches=args.max_batches or None,
            warmup=args.warmup,
            consumer_ms=args.consumer_ms,
            repeat=args.repeat,
            on_batch=on_batch,
            on_run=on_run,
        )


# -- the human report -------------------------------------------------------------------------
SUMMARY = [
    "setting",
    "samples/s",
    "runs (spread)",
    "first batch s",
    "queue mean / max / prefetch",
    "made inline",
    "skipped",
    "CPU cores",
    "peak RSS MB",
    "bottleneck",
]


def _runs(s: dict) -> str:
    runs = s["runs"]
    return "1 run" if len(runs) < 2 else f"{min(runs):,.0f}-{max(runs):,.0f} (±{s['spread'] / 2:.0%})"


def _summary_row(s: dict) -> list[str]:
    if not s["ok"]:
        return [s["label"], "FAILED"] + [""] * (len(SUMMARY) - 2)
    queue = s["queue"]
    first = s["first_batch_seconds"]
    inline = s["inline_batches"] / s["batches"] if s["batches"] else 0.0
    queued = f"{queue['fill_mean']:.1f} / {queue['fill_max']} / {queue['prefetch']}" if s["workers"] else "- (inline)"
    return [
        s["label"],
        f"{s['samples_per_second']:,.0f}",
        _runs(s),
        "" if first is None else f"{first:.3f}",
        queued,
        f"{inline:.0%}",
        f"{s['skipped']:,}",
        "-" if s["cpu_cores"] is None else f"{s['cpu_cores']:.2f}",
        f"{s['peak_rss_bytes'] / BYTES_PER_MB:,.0f}",
        s["bottleneck"]["kind"],
    ]


def _stage_row(s: dict) -> list[str]:
    if not s["ok"]:
        return [s["label"]] + [""] * len(s["stages"])
    return [s["label"]] + [f"{v['seconds']:.3f}  {v['share']:4.0%}" for v in s["stages"].values()]


def format_report(report: dict) -> str:
    """The report as a few aligned tables and plain sentences."""
    settings = report["settings"]
    bound = f"{report['max_batches']} batches" if report["max_batches"] else "whole epochs"
    lines = [
        f"steadyfeed bench: {report['source']}",
        f"batch size {report['batch_size']}, {report['epochs']} epoch(s), {report['repeat']} run(s) per "
        f"setting, {bound} per run after "
        f"{report['warmup_batches']} warm-up batch(es) (and any while the loader decided who makes batches: "
        f"warmup_batches in --json), consumer step {report['consumer_ms']:g} ms",
        "",
    ]
    lines += table(SUMMARY, [_summary_row(s) for s in settings])
    stages = settings[0]["stages"]
    side = {where: ", ".join(k for k, v in stages.items() if v["side"] == where) for where in ("workers", "consumer")}
    lines += [
        "",
        f"time per stage, seconds and share ({side['workers']}: of worker time, summed over workers; "
        f"{side['consumer']}: of wall time, in the consumer)",
    ]
    lines += table(["setting", *stages], [_stage_row(s) for s in settings])
    if report["read_includes_decode"]:
        lines.append("read includes decoding (no source times it separately)")
    if any(s["ok"] and s["workers"] and s["inline_batches"] for s in settings):
        lines.append(
            "made inline: batches the consumer made itself, as it measured that faster than "
            "handing them to a worker (inline_when_faster)"
        )
    lines.append("")
    lines += [f"FAILED {s['label']}: {s['error']}" for s in settings if not s["ok"]]
    neck, rec = report["bottleneck"], report["recommendation"]
    if neck:
        lines.append(f"bottleneck ({neck['setting']}): {neck['reason']}")
    if rec and rec["verdict"] == "tie":
        lines.append(f"tie ({', '.join(rec['tied'])}): {rec['reason']}")
    elif rec:
        lines.append(f"recommended: workers={rec['workers']}, mode={rec['mode']!r}: {rec['reason']}")
    return "\n".join(lines)
