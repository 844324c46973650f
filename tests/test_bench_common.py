"""The benchmarks' ratios (``benchmarks/_common.py``): paired round by round, so that a switch
of the machine's speed between two loaders' epochs is outvoted, and bracketed, so that a drift
over a round weighs on a reference as on the loaders run between its two halves."""

import contextlib
import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

_backend = os.environ.get("KERAS_BACKEND")
import _common  # noqa: E402  (sets KERAS_BACKEND for the benchmarks: put back for the other tests)

if _backend is None:
    os.environ.pop("KERAS_BACKEND", None)
else:
    os.environ["KERAS_BACKEND"] = _backend

pytestmark = pytest.mark.timeout(60)


def result(*rounds: float, group: str = "timed together") -> _common.Result:
    seconds = statistics.median(rounds) if rounds else 1.0
    return _common.Result("steadyfeed", "setting", 100, seconds, True, rounds=rounds, group=group)


def test_a_speed_switch_between_two_loaders_of_one_round_is_outvoted():
    # b ran 1.25x as long as a in every round but the last, where the machine slowed after a's
    # epoch and before b's: the ratio of the medians reads 2.5x, the paired one 1.25x
    a = result(1.0, 2.0, 2.0, 1.0, 1.0)
    b = result(1.25, 2.5, 2.5, 1.25, 2.5)
    assert a.rate / b.rate == pytest.approx(2.5)
    assert _common.paired(a, b) == pytest.approx(1.25)
    assert _common.paired(b, a) == pytest.approx(0.8)


def test_without_rounds_to_pair_the_ratio_is_of_the_medians():
    a = result(1.0, 1.0, 4.0)
    assert _common.paired(a, result()) == pytest.approx(a.rate / result().rate)
    assert _common.paired(a, result(1.0, 2.0)) == pytest.approx(1.5)
    # as many rounds, but other ones (the peers' group): their k-th rounds ran minutes apart
    assert _common.paired(a, result(1.0, 4.0, 4.0, group="peers")) == pytest.approx(4.0)


def test_a_reference_run_before_and_after_cancels_a_steady_drift():
    # the machine slows 10% from one loader to the next: w0, the loader judged, w0 again
    before, judged, after = result(1.0, 2.0), result(1.1, 2.2), result(1.21, 2.42)
    assert _common.paired(judged, before) == pytest.approx(1 / 1.1)  # set against w0 alone: 9% slow
    both = _common.bracketed(before, after, "w0 and w0 again")
    assert both.rounds == pytest.approx((1.1, 2.2))
    assert _common.paired(judged, both) == pytest.approx(1.0)


def test_a_reference_is_covered_only_when_both_runs_were():
    bad = _common.Result("steadyfeed", "w0 again", 100, 1.0, False, rounds=(1.0, 1.0))
    assert _common.bracketed(result(1.0, 1.0), bad, "both").covered is False


def test_interleaved_timings_keep_each_rounds_epoch_in_order():
    ran = []

    def loader(name: str, covers: bool = True):
        def epoch(e: int) -> bool:
            ran.append((name, e))
            return covers or e == 0

        return epoch

    timings = _common.time_interleaved([loader("a"), loader("b", covers=False)], 3)
    assert ran == [("a", 0), ("b", 0)] + [(name, e) for e in (1, 2, 3) for name in "ab"]
    assert [t.covered for t in timings] == [True, False]
    for t in timings:
        assert len(t.rounds) == 3 and t.seconds == statistics.median(t.rounds)


def test_loaders_timed_one_at_a_time_give_each_rounds_median():
    opened = []

    def opener(name: str):
        @contextlib.contextmanager
        def open_loader():
            opened.append(name)
            yield lambda e: True

        return open_loader

    timings = _common.time_in_rounds([opener("a"), opener("b")], epochs=6, rounds=3)
    assert opened == ["a", "b"] * 3
    for t in timings:
        assert t.covered and len(t.rounds) == 3
