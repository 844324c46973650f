"""``steadyfeed bench``: the command end to end on a generated spec file, and the
bottleneck and recommendation rules on constructed measurements."""

import json
import textwrap

import numpy as np
import pytest

from steadyfeed import ArraySource, Loader
from steadyfeed.tools import plots
from steadyfeed.tools.bench import (
    WARMUP_WHILE_DECIDING,
    Measurement,
    Setting,
    diagnose,
    gil_limited,
    measure,
    recommend,
)
from steadyfeed.tools.bench_command import format_report
from steadyfeed.tools.cli import main

pytestmark = pytest.mark.timeout(120)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STAGE_KEYS = {"read", "transform", "collate", "transport", "wait", "step"}

SPEC_FILE = """
    import multiprocessing
    import time

    import numpy as np

    from steadyfeed import ArraySource, Loader


    def _source(n=512):
        x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
        return ArraySource(x=x, y=x.sum(axis=1))


    def slow_transform(sample, rng):
        time.sleep(0.002)
        return sample


    def fails_in_worker_processes(sample, rng):
        if multiprocessing.parent_process() is not None:
            raise ValueError("this transform cannot run in a worker process")
        return sample


    def fast():
        return Loader(_source(), 16)


    def fast_window_of_4():  # the window a short run fills: the epoch's last batches drain it
        return Loader(_source(), 16, prefetch=4)


    def slow():
        return Loader(_source(), 8, transform=slow_transform)


    def fails_in_processes():
        return Loader(_source(), 16, transform=fails_in_worker_processes)
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    """``spec("fast")`` -> a FILE.py:NAME spec of the generated file (one file: it is imported once)."""
    path = tmp_path_factory.mktemp("bench") / "bench_spec_data.py"
    path.write_text(textwrap.dedent(SPEC_FILE))
    return lambda name: f"{path}:{name}"


def bench(capsys, *argv, progress=False):
    code = main(["bench", *argv, *([] if progress else ["--no-progress"])])
    out, err = capsys.readouterr()
    return code, out, err


def bench_json(capsys, *argv):
    code, out, _ = bench(capsys, *argv, "--json")
    return code, json.loads(out)


# -- the command ---------------------------------------------------------------------------------
def test_json_has_every_setting_with_its_measurements(spec, capsys, no_leaks):
    code, report = bench_json(
        capsys, spec("fast"), "--workers", "0,1,2", "--modes", "thread,process", "--max-batches", "8"
    )
    assert code == 0
    labels = [s["label"] for s in report["settings"]]
    assert labels == ["inline", "1 thread", "1 process", "2 thread", "2 process"]  # cheapest first, inline once
    for s in report["settings"]:
        assert s["ok"] and s["error"] is None and s["samples_per_second"] > 0
        assert s["batches"] == 8 and s["samples"] == 8 * 16  # warm-up left out
        assert set(s["stages"]) == STAGE_KEYS
        assert all({"seconds", "share"} <= set(v) for v in s["stages"].values())
        assert s["first_batch_seconds"] > 0 and s["peak_rss_bytes"] > 0 and s["cpu_seconds"] >= 0
        assert 1 <= s["queue"]["fill_max"] <= s["queue"]["prefetch"] and s["queue"]["timeline"]
        assert s["bottleneck"]["kind"] in {"producers", "consumer", "balanced"}
    assert report["settings"][2]["stages"]["transport"]["seconds"] > 0  # processes copy out of shared memory
    assert report["read_includes_decode"] is True
    assert report["recommendation"]["label"] in labels and report["bottleneck"]["reason"]


def test_plot_is_a_png_drawn_on_an_agg_canvas(spec, capsys, tmp_path):
    # no no_leaks here: matplotlib keeps its font files open in a process-wide cache, by design
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    png = tmp_path / "bench.png"
    code, report = bench_json(
        capsys, spec("fast"), "--workers", "1", "--modes", "thread", "--max-batches", "4", "--plot", str(png)
    )
    assert code == 0 and png.read_bytes()[:8] == PNG_SIGNATURE
    figure = plots.bench_figure(report)  # what --plot saved
    assert isinstance(figure.canvas, FigureCanvasAgg) and len(figure.axes) == 2


def test_human_table_names_the_bottleneck_and_recommends_a_setting(spec, capsys, no_leaks):
    code, out, err = bench(
        capsys, spec("fast"), "--workers", "0,1", "--modes", "thread", "--max-batches", "6", progress=True
    )
    assert code == 0
    for text in (
        "samples/s",
        "first batch s",
        "queue mean / max / prefetch",
        "CPU cores",
        "peak RSS MB",
        "inline",
        "1 thread",
        "transform",
        "transport",
        "read includes decoding",
        "runs (spread)",
        "bottleneck (",
    ):
        assert text in out
    assert "recommended: workers=" in out or "tie (inline, 1 thread): " in out  # which one: the machine's call
    assert "bench 1 thread" in err  # the progress bar, on stderr only


def test_a_slow_transform_is_named_producer_bound(spec, capsys, no_leaks):
    code, report = bench_json(capsys, spec("slow"), "--workers", "1", "--modes", "thread", "--max-batches", "10")
    assert code == 0
    setting = report["settings"][0]
    assert report["bottleneck"]["kind"] == "producers"
    assert "the transform takes" in report["bottleneck"]["reason"]
    assert setting["stages"]["transform"]["share"] > 0.8 and setting["stages"]["wait"]["share"] >= 0.5


def test_a_slow_consumer_is_named_consumer_bound_with_a_full_queue(spec, capsys, no_leaks):
    code, report = bench_json(
        capsys,
        spec("fast_window_of_4"),
        "--workers",
        "2",
        "--modes",
        "thread",
        "--max-batches",
        "15",
        "--consumer-ms",
        "20",
    )
    assert code == 0
    setting = report["settings"][0]
    assert report["bottleneck"]["kind"] == "consumer"
    assert "queue stays full" in report["bottleneck"]["reason"] and "training step" in report["bottleneck"]["reason"]
    # a place in the window is refilled as a batch is taken: a slow consumer finds it full
    assert setting["queue"]["fill_max"] == setting["queue"]["prefetch"]
    assert setting["queue"]["fill_mean"] >= setting["queue"]["prefetch"] - 0.5
    assert setting["stages"]["step"]["share"] > 0.8


def test_a_failing_setting_is_reported_the_others_run_and_the_exit_code_is_1(spec, capsys, no_leaks):
    code, report = bench_json(
        capsys, spec("fails_in_processes"), "--workers", "1", "--modes", "thread,process", "--max-batches", "4"
    )
    assert code == 1
    threads, processes = report["settings"]
    assert threads["ok"] and threads["samples_per_second"] > 0
    assert not processes["ok"] and processes["error"].startswith("SampleError[ValueError]: sample 0")
    assert "cannot run in a worker process" in processes["error"]
    assert report["recommendation"]["label"] == "1 thread"
    assert "FAILED 1 process: SampleError[ValueError]: sample 0" in format_report(report)


@pytest.mark.parametrize(
    "argv", [["--workers", "1,x"], ["--workers", "-1"], ["--modes", "fork"], ["--max-batches", "-3"], ["--epochs", "0"]]
)
def test_bad_flags_are_usage_errors(spec, argv):
    with pytest.raises(SystemExit) as exc:
        main(["bench", spec("fast"), *argv])
    assert exc.value.code == 2


def test_a_spec_that_does_not_load_or_a_plot_with_nowhere_to_go_is_a_usage_error(spec, tmp_path, capsys):
    code, _, err = bench(capsys, f"{tmp_path}/missing.py:loader")
    assert code == 2 and "missing.py" in err
    code, _, err = bench(capsys, spec("fast"), "--plot", f"{tmp_path}/no/such/dir/bench.png")
    assert code == 2 and "no such directory" in err


# -- the rules -----------------------------------------------------------------------------------
def measured(workers, mode, samples_per_second, *, cores=1.0, wait=0.9, fill=1.0, prefetch=4):
    """A Measurement of one second with the given throughput, CPU, consumer wait share and queue fill."""
    m = Measurement(
        Setting(workers, mode),
        samples=int(samples_per_second),
        seconds=1.0,
        cpu_seconds=cores,
        prefetch=prefetch,
        fill_mean=fill,
    )
    m.stage_seconds.update(read=0.1, transform=0.8, collate=0.1, wait=wait)
    m.diagnosis = diagnose(m)
    return m


def test_threads_that_do_not_scale_on_one_core_are_named_the_gil():
    runs = [
        measured(1, "thread", 1000, cores=0.9),
        measured(2, "thread", 1050, cores=1.0),
        measured(2, "process", 1900, cores=2.0),
    ]
    gil = gil_limited(runs)
    assert gil.kind == "gil" and gil.setting == Setting(2, "thread")
    assert "use mode='process' (2 process" in gil.reason


def test_threads_that_scale_or_wait_on_the_consumer_are_not_the_gil():
    assert gil_limited([measured(1, "thread", 1000), measured(2, "thread", 1900, cores=1.0)]) is None
    consumer_bound = [measured(1, "thread", 1000, wait=0.01, fill=3), measured(2, "thread", 1000, wait=0.01, fill=3)]
    assert gil_limited(consumer_bound) is None
    assert consumer_bound[1].diagnosis.kind == "consumer"


def test_the_recommendation_is_the_fastest_unless_a_cheaper_one_is_within_5_percent():
    runs = [measured(0, "thread", 500), measured(2, "thread", 970), measured(2, "process", 1000)]
    assert recommend(runs).setting == Setting(2, "thread")
    runs[1] = measured(2, "thread", 940)
    assert recommend(runs).setting == Setting(2, "process")
    assert recommend([Measurement(Setting(1, "thread"), error="SampleError: ...")]) is None


def test_a_window_too_short_for_the_cpu_clock_has_no_cpu_figure():
    short = Measurement(Setting(0, "thread"), samples=8, seconds=0.001, cpu_seconds=0.01)  # one 10 ms tick
    assert short.cpu_cores is None and short.as_dict()["cpu_cores"] is None
    assert Measurement(Setting(0, "thread"), samples=8, seconds=1.0, cpu_seconds=0.5).cpu_cores == 0.5


def test_the_window_opens_once_the_loader_has_decided_who_makes_batches(no_leaks):
    x = np.arange(16000 * 4, dtype=np.float32).reshape(16000, 4)
    # 2000 batches: the decision (~450 batches with 8 a task and the default prefetch) ends well
    # before WARMUP_WHILE_DECIDING and half of them. With 200 it did not, and the window held
    # a mix (32 of 40 made inline)
    loader = Loader(ArraySource(x=x, y=x.sum(axis=1)), 8)
    m = measure(loader, Setting(2, "thread"), max_batches=40)
    # cheap batches: the loader probes making them itself (some dozens of batches) first; the
    # window holds only what it decided, all made one way, never the probe's mix. A decision
    # that outlasts the warm-up's cap opens the window anyway, as documented: on a loaded
    # machine (two CPU hogs beside it) the probe's way took 550 to 600+ batches, and a window
    # opened at the cap held 5 to 32 of 40 made inline
    assert m.ok and m.batches == 40 and 2 < m.warmup_batches <= 2 + WARMUP_WHILE_DECIDING
    decided = m.warmup_batches < 2 + WARMUP_WHILE_DECIDING
    assert m.inline_batches in (0, m.batches) or not decided
    quick = measure(Loader(ArraySource(x=x[:160], y=x[:160, 0]), 8, batches_per_task=1), Setting(2, "thread"))
    assert quick.ok and quick.warmup_batches <= 2 + (20 - 2) // 2  # a short epoch keeps half for the window
    assert measure(loader, Setting(2, "thread"), warmup=0, max_batches=4).warmup_batches == 0


def test_the_report_counts_batches_the_consumer_made(spec, capsys, no_leaks):
    code, report = bench_json(capsys, spec("fast"), "--workers", "0,1", "--modes", "thread", "--max-batches", "6")
    assert code == 0
    by_label = {s["label"]: s for s in report["settings"]}
    assert by_label["inline"]["inline_batches"] == by_label["inline"]["batches"] > 0  # workers=0: all of them
    assert 0 <= by_label["1 thread"]["inline_batches"] <= by_label["1 thread"]["batches"]
    code, out, _ = bench(capsys, spec("fast"), "--workers", "0", "--modes", "thread", "--max-batches", "4")
    assert code == 0 and "made inline" in out and "100%" in out


# -- repeats, spread and ties ------------------------------------------------------------------------
def ran(workers, mode, *runs, prefetch=4):
    """A Measurement whose runs gave ``runs`` samples/s (its window: the median's)."""
    m = measured(workers, mode, sorted(runs)[len(runs) // 2], prefetch=prefetch)
    m.runs = list(runs)
    m.timeline = [(0.01 * k, k % (prefetch + 1)) for k in range(20)] if workers else []
    return m


def test_each_setting_runs_repeat_times_in_turns_and_the_report_shows_the_spread(spec, capsys, no_leaks):
    from steadyfeed.tools.bench import bench as run_bench
    from steadyfeed.tools.bench import grid

    order = []
    loader = Loader(ArraySource(x=np.zeros((64, 2), np.float32)), 8)
    report = run_bench(
        loader,
        grid([0, 1], ["thread"]),
        max_batches=3,
        repeat=2,
        on_run=lambda setting, round_: order.append((setting.label, round_)),
    )
    assert order == [("inline", 0), ("1 thread", 0), ("inline", 1), ("1 thread", 1)]  # in turns
    assert all(len(m.runs) == 2 and m.slowest <= m.samples_per_second <= m.fastest for m in report.measurements)
    code, out, _ = bench(
        capsys, spec("fast"), "--workers", "0,1", "--modes", "thread", "--max-batches", "3", "--repeat", "2"
    )
    assert code == 0 and "runs (spread)" in out and "2 run(s) per setting" in out
    code, report = bench_json(capsys, spec("fast"), "--workers", "1", "--modes", "thread", "--max-batches", "3")
    assert report["repeat"] == 3 and len(report["settings"][0]["runs"]) == 3  # the default


def test_a_setting_is_recommended_only_when_it_beats_every_other_in_every_run():
    clear = [ran(0, "thread", 500, 520, 510), ran(2, "thread", 1000, 1010, 990)]
    rec = recommend(clear)
    assert (rec.verdict, rec.setting, rec.tied) == ("recommended", Setting(2, "thread"), [])
    overlapping = [ran(0, "thread", 900, 1100, 1000), ran(2, "thread", 1000, 1200, 1150)]
    rec = recommend(overlapping)
    assert rec.verdict == "tie" and rec.tied == [Setting(0, "thread"), Setting(2, "thread")]
    assert rec.setting == Setting(0, "thread") and "tie" in rec.reason and "cheapest is inline" in rec.reason
    report = format_report(
        {
            "source": "s",
            "batch_size": 8,
            "epochs": 1,
            "repeat": 3,
            "max_batches": 3,
            "warmup_batches": 2,
            "consumer_ms": 0,
            "read_includes_decode": True,
            "settings": [m.as_dict() for m in overlapping],
            "bottleneck": None,
            "recommendation": {
                "verdict": "tie",
                "tied": ["inline", "2 thread"],
                "label": "inline",
                "workers": 0,
                "mode": "thread",
                "reason": rec.reason,
            },
        }
    )
    assert "tie (inline, 2 thread):" in report and "recommended:" not in report


def test_identical_runs_that_only_noise_tells_apart_always_get_the_same_answer():
    # three benches of one machine: the medians come out in another order every time
    answers = set()
    for speeds in [(1000, 1040, 980), (1040, 980, 1000), (980, 1000, 1040)]:
        grid_ = [(0, "thread"), (1, "thread"), (2, "process")]
        runs = [ran(w, m, s - 40, s, s + 40) for (w, m), s in zip(grid_, speeds)]
        rec = recommend(runs)
        answers.add((rec.verdict, rec.setting))
    assert answers == {("tie", Setting(0, "thread"))}


def test_the_plot_draws_only_settings_with_a_queue_on_one_time_axis_and_no_axis_below_zero():
    from steadyfeed.tools.bench import Report

    runs = [
        ran(0, "thread", 500, 510),
        ran(1, "thread", 800, 820),
        ran(2, "thread", 900, 950),
        Measurement(Setting(2, "process"), error="SampleError: sample 3 ..."),
    ]
    report = Report(runs, recommend(runs), None, {}).as_dict()
    figure = plots.bench_figure(report)
    throughput, *queues = figure.axes
    assert [ax.get_title().split(":")[0] for ax in queues] == ["1 thread", "2 thread"]  # no inline, no failed one
    assert queues[0].get_shared_x_axes().joined(queues[0], queues[1])
    assert throughput.get_ylim()[0] == 0 and all(ax.get_ylim()[0] == 0 for ax in queues)
    failed = [Measurement(Setting(w, "thread"), error="TooManyErrors: ...") for w in (0, 1)]
    figure = plots.bench_figure(Report(failed, None, None, {}).as_dict())
    (only,) = figure.axes
    low, high = only.get_ylim()
    assert low == 0 and high > 0


def test_bad_files_are_measured_under_skip_with_max_error_fraction(tmp_path, capsys, no_leaks):
    for d in ("in", "lab"):
        (tmp_path / d).mkdir()
    for i in range(20):
        np.save(tmp_path / "in" / f"{i:02d}.npy", np.full(4, i, np.float32))
        np.save(tmp_path / "lab" / f"{i:02d}.npy", np.int64(i))
    for i in (3, 7, 11):
        (tmp_path / "in" / f"{i:02d}.npy").write_bytes(b"\x93NUMPY garbage")
    data = [
        "--npy-pairs",
        str(tmp_path / "in"),
        str(tmp_path / "lab"),
        "--batch-size",
        "4",
        "--workers",
        "0,2",
        "--modes",
        "thread",
        "--warmup",
        "0",
        "--max-batches",
        "0",
        "--repeat",
        "1",
    ]
    code, report = bench_json(capsys, *data)
    assert code == 1 and all(s["error"].startswith("SampleError[DataError]: sample 3") for s in report["settings"])
    code, report = bench_json(capsys, *data, "--on-error", "skip")
    assert code == 1 and all(
        "TooManyErrors" in s["error"] and "max_error_fraction=0.1" in s["error"] for s in report["settings"]
    )
    code, report = bench_json(capsys, *data, "--on-error", "skip", "--max-error-fraction", "0.2")
    assert code == 0 and [(s["samples"], s["skipped"]) for s in report["settings"]] == [(17, 3), (17, 3)]


def test_auto_is_a_setting_that_says_what_it_picked_and_why(spec, capsys, no_leaks):
    code, report = bench_json(capsys, spec("fast"), "--workers", "0,auto", "--max-batches", "8")
    assert code == 0
    labels = [s["label"] for s in report["settings"]]
    assert labels == ["inline", "auto"]  # once, last (it picks the mode too)
    auto = report["settings"][1]
    assert auto["ok"] and auto["samples"] == 8 * 16
    assert auto["picked"]["mode"] in ("thread", "process") and auto["picked"]["workers"] >= 1
    assert auto["picked"]["reason"] and report["settings"][0]["picked"] is None
