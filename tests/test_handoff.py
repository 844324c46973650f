"""Who makes a batch (a worker or the consumer) never changes what is delivered, and the
measured choice picks the faster way.

The state machine is driven with synthetic timings (no test here depends on the
machine's speed); the loader tests force every mix of inline and worker batches with a
scripted handoff and compare against ``workers=0``.
"""

import os

import numpy as np
import pytest
from helpers import FaultySource, noisy, paired_source
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import steadyfeed.loader as loader_module
from steadyfeed import Loader, SampleError
from steadyfeed.config import LoaderConfig
from steadyfeed.execution import handoff as H

pytestmark = pytest.mark.timeout(120)

US, MS = 1e-6, 1e-3
LONG_EPOCH = 10**6  # batches an epoch hands out, where its length plays no part


@pytest.fixture(autouse=True)
def measures_by_count(monkeypatch):
    """These tests count batches: the second measure's seconds bound is off but where a test sets it."""
    monkeypatch.setattr(H, "CONFIRM_SECONDS", 0.0)


def feed(handoff, n, cycle, in_loader, work, made_here=False):
    for _ in range(n):
        handoff.record(cycle, in_loader, {"read": work, "transport": 1.0}, made_here)  # transport is no work


def reconfirmed(handoff, cycle):
    """After a probe the workers came out faster: measured again at ``cycle`` (their batches
    as costly as when first measured), they beat the consumer again and keep the batches."""
    assert handoff._phase == "confirm" and handoff.to_workers
    feed(handoff, H.PROBE_BATCHES, cycle, cycle, handoff._workers_work)
    assert handoff.to_workers and handoff._phase == "keep"


def measured(settle=2):
    return H.MeasuredHandoff(settle=settle)


def confirmed(handoff, cycle, settle=0):
    """After a probe the consumer won: the workers, measured again at ``cycle`` (their batches
    as costly as when first measured), lose again; it still decides while their batches in
    flight arrive, and is done at its first batch."""
    assert handoff._phase == "confirm" and handoff.to_workers
    work = handoff._workers_work
    feed(handoff, settle + H.PROBE_BATCHES, cycle, cycle, work)
    assert handoff.deciding and not handoff.to_workers
    feed(handoff, 3, cycle, cycle, work)  # in flight
    assert handoff.deciding
    feed(handoff, 1, cycle, cycle, work, made_here=True)
    assert not handoff.deciding


# -- the state machine ----------------------------------------------------------------------
def test_cheap_batches_move_to_the_consumer_after_a_probe():
    h = measured()
    feed(h, 2 + H.PROBE_BATCHES - 1, 30 * US, 25 * US, 10 * US)
    assert h.to_workers  # settling, then measuring: still the workers'
    feed(h, 1, 30 * US, 25 * US, 10 * US)
    assert not h.to_workers  # probing: no new task goes out
    feed(h, 3, 30 * US, 25 * US, 10 * US, made_here=False)  # in-flight batches arriving: ignored
    feed(h, 1 + H.PROBE_BATCHES, 15 * US, 15 * US, 10 * US, made_here=True)
    confirmed(h, 30 * US, settle=2)
    assert not h.to_workers and h._phase == "keep"


def test_mean_not_median_decides_bimodal_cycles():
    """Most batches ready at once, every third waited for: the throughput is the mean."""
    h = measured(settle=0)
    for k in range(H.PROBE_BATCHES):
        h.record(100 * US if k % 3 == 0 else 10 * US, 95 * US if k % 3 == 0 else 5 * US, {"read": 20 * US}, False)
    assert not h.to_workers
    feed(h, 1 + H.PROBE_BATCHES, 25 * US, 25 * US, 20 * US, made_here=True)  # 25 us < mean 40 us, > median 10 us
    confirmed(h, 40 * US)
    assert not h.to_workers


def test_work_hidden_by_workers_is_never_probed():
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 10 * MS, 0.1 * MS, 5 * MS)  # training-bound: batches are ready, costly to make
    assert h.to_workers and h._phase == "keep"


def test_work_inflated_by_contending_workers_is_probed():
    """4 threads on 2 cores: each takes 4x as long over a batch as one would, and the consumer
    waits for every batch; the gate reads the work per worker, so the consumer gets its probe."""
    hidden = H.MeasuredHandoff(settle=0, workers=1)
    feed(hidden, H.PROBE_BATCHES, 650 * US, 140 * US, 600 * US)
    assert hidden.to_workers and hidden._phase == "keep"  # one worker that slow would hide it
    contended = H.MeasuredHandoff(settle=0, workers=4)
    feed(contended, H.PROBE_BATCHES, 150 * US, 140 * US, 600 * US)
    assert not contended.to_workers and contended._phase == "probe"
    feed(contended, 1 + H.PROBE_BATCHES, 67 * US, 67 * US, 60 * US, made_here=True)
    confirmed(contended, 150 * US)
    assert not contended.to_workers and contended._phase == "keep"


def test_probe_stops_early_when_the_consumer_is_clearly_slower():
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 10 * MS, 9 * MS, 10 * MS)  # worker-bound: the gate lets a probe run
    assert not h.to_workers
    feed(h, 1 + 2 * H.ABORT_AFTER - 1, 20 * MS, 20 * MS, 20 * MS, made_here=True)
    assert not h.to_workers  # too few cycles to judge yet: the first ABORT_AFTER warm the consumer up
    feed(h, 1, 20 * MS, 20 * MS, 20 * MS, made_here=True)
    assert h._phase == "confirm"  # the probe ends here; the workers are measured once more
    reconfirmed(h, 10 * MS)


def test_one_slow_first_batch_does_not_end_a_probe():
    """The consumer's first batches open files of its own: one slow cycle must not decide."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 300 * US, 250 * US, 300 * US)
    feed(h, 1, 900 * US, 900 * US, 300 * US, made_here=True)  # the transition: not counted
    feed(h, H.ABORT_AFTER, 600 * US, 600 * US, 300 * US, made_here=True)  # warming up: not counted
    feed(h, H.PROBE_BATCHES - H.ABORT_AFTER, 170 * US, 170 * US, 160 * US, made_here=True)
    confirmed(h, 300 * US)
    assert not h.to_workers and h._phase == "keep"


def test_workers_measured_while_the_data_was_cold_are_measured_again_before_they_lose():
    """Cold workers (a pack's readahead under way), then a consumer probed once the data is
    warm: the consumer looks faster, but the two workers, measured again, beat it, and keep the batches."""
    h = H.MeasuredHandoff(settle=2, workers=2)
    feed(h, 2 + H.PROBE_BATCHES, 8 * MS, 7 * MS, 12 * MS)  # cold: every batch waited for
    feed(h, 1 + H.PROBE_BATCHES, 5 * MS, 5 * MS, 5 * MS, made_here=True)  # warm, in one thread
    assert h._phase == "confirm" and h.to_workers and h.deciding
    h.new_epoch(LONG_EPOCH)  # a new epoch in between: the pipeline refills before the measure counts
    feed(h, 2, 30 * MS, 1 * MS, 6 * MS)
    feed(h, 3, 5 * MS, 5 * MS, 5 * MS, made_here=True)  # the consumer's own last batches: not counted
    feed(h, H.PROBE_BATCHES - 1, 3 * MS, 2.5 * MS, 6 * MS)
    assert h._phase == "confirm"
    feed(h, 1, 3 * MS, 2.5 * MS, 6 * MS)
    assert h.to_workers and h._phase == "keep"


def test_workers_measured_again_must_clearly_beat_the_consumer():
    """The consumer probed faster (5 ms against 8); the workers, measured again, come out 5%
    faster than it (4.75 ms): within the noise of two measures, so the consumer takes the batches."""
    h = H.MeasuredHandoff(settle=0, workers=2)
    feed(h, H.PROBE_BATCHES, 8 * MS, 7 * MS, 12 * MS)
    feed(h, 1 + H.PROBE_BATCHES, 5 * MS, 5 * MS, 5 * MS, made_here=True)
    assert h._phase == "confirm"
    feed(h, H.PROBE_BATCHES, 4.75 * MS, 4 * MS, 6 * MS)
    assert h._phase == "handover" and not h.to_workers


def test_a_way_kept_is_measured_again_once_it_drifts_slower():
    """Workers kept at a 100 us cycle: measures' worth of cycles 10% slower keep them, 30%
    slower in ``DRIFT_WINDOWS`` measures in a row measure both ways again, whatever the batches
    or seconds since (``DRIFT_RATIO``); one slow measure between normal ones is a pause."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 100 * US, 10 * US, 90 * US)  # the gate: workers hide the work
    assert h._phase == "keep" and h.to_workers
    feed(h, H.DRIFT_AFTER, 100 * US, 10 * US, 90 * US)  # no look before DRIFT_AFTER batches
    feed(h, 3 * H.PROBE_BATCHES, 110 * US, 10 * US, 90 * US)
    for _ in range(3):  # a pause now and then
        feed(h, H.PROBE_BATCHES, 130 * US, 10 * US, 90 * US)
        feed(h, H.PROBE_BATCHES, 100 * US, 10 * US, 90 * US)
    assert h._phase == "keep"
    feed(h, H.DRIFT_WINDOWS * H.PROBE_BATCHES - 1, 130 * US, 10 * US, 90 * US)
    assert h._phase == "keep"  # the measures' worth is needed
    feed(h, 1, 130 * US, 10 * US, 90 * US)
    assert h._phase == "measure" and h.to_workers


def test_workers_kept_are_measured_again_once_their_batches_take_much_less_work():
    """A MemoryCache filled by its first epoch: JPEGs decoded by the workers at 3 ms a batch,
    then copied out of the cache at 40 us, which the consumer does faster than a hand-off.
    Half the work is not enough (``WORK_DROP``); once measured again, the consumer keeps the
    batches."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 3 * MS, 10 * US, 3 * MS)  # decoding: the workers hide the work
    assert h._phase == "keep" and h.to_workers
    feed(h, 2 * H.PROBE_BATCHES, 1.6 * MS, 10 * US, 1.6 * MS)  # not quite half the work
    assert h._phase == "keep"
    feed(h, H.PROBE_BATCHES - 1, 50 * US, 40 * US, 40 * US)  # cached
    assert h._phase == "keep"  # a whole window is needed
    feed(h, 1, 50 * US, 40 * US, 40 * US)
    assert h._phase == "measure" and h.to_workers
    feed(h, H.PROBE_BATCHES, 50 * US, 40 * US, 40 * US)
    feed(h, 1 + H.PROBE_BATCHES, 20 * US, 20 * US, 20 * US, made_here=True)
    confirmed(h, 50 * US)
    assert h._phase == "keep" and not h.to_workers


def probed_on_decoding_then_cached(h):
    """2 threads measured decoding JPEGs (7 ms of work a batch, the consumer waiting), the
    consumer probed on decoding too (3.5 ms a batch), then a MemoryCache is full: the workers,
    measured again, copy cached batches at 0.58 ms a batch (0.9 ms of work)."""
    feed(h, H.PROBE_BATCHES, 4 * MS, 3.9 * MS, 7 * MS)
    assert h._phase == "probe"
    feed(h, 1 + H.PROBE_BATCHES, 3.5 * MS, 3.5 * MS, 3.4 * MS, made_here=True)
    assert h._phase == "confirm"
    feed(h, H.PROBE_BATCHES, 0.58 * MS, 0.5 * MS, 0.9 * MS)


def test_a_probe_of_batches_that_since_changed_cost_is_made_again():
    """The workers beat a probe of other batches (0.58 against 3.5 ms): as their work changed
    2x and more since they were first measured, everything is measured again, on cached
    batches, and the consumer keeps them (the benchmark's MemoryCache kept its workers)."""
    h = H.MeasuredHandoff(settle=0, workers=2)
    probed_on_decoding_then_cached(h)
    assert h._phase == "measure" and h.to_workers  # not kept: measured again
    feed(h, H.PROBE_BATCHES, 0.58 * MS, 0.5 * MS, 0.9 * MS)
    assert h._phase == "probe"
    feed(h, 1 + H.PROBE_BATCHES, 0.3 * MS, 0.3 * MS, 0.25 * MS, made_here=True)
    confirmed(h, 0.58 * MS)
    assert h._phase == "keep" and not h.to_workers


def test_a_cost_that_keeps_changing_is_decided_after_one_more_measure():
    h = H.MeasuredHandoff(settle=0, workers=2)
    probed_on_decoding_then_cached(h)
    feed(h, H.PROBE_BATCHES, 0.58 * MS, 0.5 * MS, 0.9 * MS)
    feed(h, 1 + H.PROBE_BATCHES, 0.3 * MS, 0.3 * MS, 0.25 * MS, made_here=True)
    assert h._phase == "confirm"
    feed(h, H.PROBE_BATCHES, 0.58 * MS, 0.5 * MS, 5 * MS)  # changed again: decided as it is
    assert h._phase == "handover" and not h.to_workers


def test_work_that_gets_cheaper_is_looked_at_only_while_workers_keep_the_batches():
    """A consumer kept is measured again when it drifts slower; cheaper batches of its own
    only make it faster."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 30 * US, 25 * US, 10 * US)
    feed(h, 1 + H.PROBE_BATCHES, 10 * US, 10 * US, 10 * US, made_here=True)
    confirmed(h, 30 * US)
    feed(h, 4 * H.PROBE_BATCHES, 1 * US, 1 * US, 1 * US, made_here=True)  # the consumer's batches: cheaper
    assert h._phase == "keep" and not h.to_workers


def test_workers_are_not_measured_until_the_tasks_size_is_picked():
    """While grouping.py's "auto" learns, the workers' cost is about to change: nothing counts;
    once it has picked, the pipeline refills (settle, in tasks of the new size) before a measure."""
    size = {"per_task": 1, "picked": False}
    h = H.MeasuredHandoff(settle=2, per_task=lambda: size["per_task"], steady=lambda: size["picked"])
    feed(h, 10 * H.PROBE_BATCHES, 900 * US, 10 * US, 90 * US)
    assert h._phase == "measure" and not h._pooled
    size.update(per_task=4, picked=True)
    feed(h, 2 * 4, 900 * US, 10 * US, 90 * US)  # steady: 2 tasks of 4 skipped first
    feed(h, H.PROBE_BATCHES - 1, 100 * US, 10 * US, 90 * US)
    assert h._phase == "measure"
    feed(h, 1, 100 * US, 10 * US, 90 * US)
    assert h._phase == "keep" and h._pooled_cycle == pytest.approx(100 * US)


def test_an_epochs_refill_is_no_drift():
    """Workers kept at 100 us: a new epoch's first batches wait for the first tasks (3 ms
    each here); they are skipped, and the cycles after them hold no drift."""
    h = measured(settle=2)
    feed(h, 2 + H.PROBE_BATCHES + H.DRIFT_AFTER, 100 * US, 10 * US, 90 * US)
    assert h._phase == "keep" and h.to_workers
    for _ in range(3):
        h.new_epoch(LONG_EPOCH)
        feed(h, 2, 3 * MS, 3 * MS, 90 * US)  # the refill: two batches waited for
        feed(h, H.PROBE_BATCHES, 100 * US, 10 * US, 90 * US)
        assert h._phase == "keep"
    for _ in range(H.DRIFT_WINDOWS):  # within an epoch, the same waits are a drift
        feed(h, 2, 3 * MS, 3 * MS, 90 * US)
        feed(h, H.PROBE_BATCHES - 2, 100 * US, 10 * US, 90 * US)
    assert h._phase == "measure"


def test_a_drift_is_looked_at_once_between_two_rechecks():
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 100 * US, 10 * US, 90 * US)
    feed(h, H.DRIFT_AFTER, 100 * US, 10 * US, 90 * US)
    feed(h, H.DRIFT_WINDOWS * H.PROBE_BATCHES, 130 * US, 10 * US, 90 * US)  # drifted: measured again
    assert h._phase == "measure"
    feed(h, H.PROBE_BATCHES, 130 * US, 10 * US, 90 * US)  # and kept
    assert h._phase == "keep" and h.to_workers
    feed(h, H.DRIFT_AFTER + 4 * H.PROBE_BATCHES, 300 * US, 10 * US, 90 * US)  # drifts again: kept
    assert h._phase == "keep"


def test_a_measure_that_drains_a_full_window_reads_the_workers_no_faster_than_their_work_allows():
    """4 threads, 1.6 ms of work each per batch: at best a batch every 400 us. A measure that
    starts with tasks of 8 batches ready in the window drains them at a 150 us cycle; read as
    it was, it kept the workers, which then ran at 350 us a batch against the consumer's 320."""
    h = H.MeasuredHandoff(settle=0, workers=4)
    feed(h, H.PROBE_BATCHES, 150 * US, 140 * US, 1600 * US)
    assert h._phase == "probe" and h._pooled_cycle == pytest.approx(400 * US)
    feed(h, 1 + H.PROBE_BATCHES, 320 * US, 320 * US, 300 * US, made_here=True)
    assert h._phase == "confirm"  # the consumer came out faster: the workers get a second look
    feed(h, H.PROBE_BATCHES, 180 * US, 170 * US, 1400 * US)  # drained again: 350 us at best
    assert h._phase == "handover" and not h.to_workers


def test_a_measure_that_drains_a_full_window_gives_the_consumer_its_probe():
    """4 threads measured while draining ready batches: a 69 us cycle, 58 us of it in the loader,
    for 1265 us of work each per batch (at best one every 316 us). Read as it was, the consumer
    seemed to wait too little to be worth a probe, and the workers were kept without one at 80k
    rows/s against the consumer's 107k; at their pace it waits ~300 us a batch in the loader."""
    h = H.MeasuredHandoff(settle=0, workers=4)
    feed(h, H.PROBE_BATCHES, 69 * US, 58 * US, 1265 * US)
    assert h._phase == "probe" and not h.to_workers
    hidden = H.MeasuredHandoff(settle=0, workers=4)  # a training step of 10 ms: the workers keep up
    feed(hidden, H.PROBE_BATCHES, 10 * MS, 58 * US, 20 * MS)
    assert hidden._phase == "keep" and hidden.to_workers


def test_a_measure_spans_two_rounds_of_tasks():
    """4 threads, 8 batches a task: 32 batches come back at once, then 32 are waited for. A
    measure of 32 that began on the ready ones read a 19 us cycle; two rounds hold the wait."""
    h = H.MeasuredHandoff(settle=0, workers=4, per_task=lambda: 8)
    feed(h, H.PROBE_BATCHES, 19 * US, 7 * US, 200 * US)  # one round ready at once
    assert h._phase == "measure"
    feed(h, H.PROBE_BATCHES - 1, 19 * US, 7 * US, 200 * US)
    feed(h, 1, 3 * MS, 3 * MS, 200 * US)  # the next round waited for
    assert h._phase == "probe" and h._pooled_cycle == pytest.approx((63 * 19 * US + 3 * MS) / 64)


def test_a_consumer_kept_is_measured_again_once_slower_than_the_workers_were():
    """The consumer won at 170 us against workers measured again at 300 us: it keeps the
    batches at 320 us a cycle (a tie with its rival), and is measured again at 340 us (10%
    slower than its rival was)."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 300 * US, 250 * US, 300 * US)
    feed(h, 1 + H.PROBE_BATCHES, 170 * US, 170 * US, 160 * US, made_here=True)
    confirmed(h, 300 * US)
    assert h._phase == "keep" and not h.to_workers
    feed(h, H.DRIFT_AFTER, 400 * US, 400 * US, 160 * US, made_here=True)  # not looked at yet
    assert h._phase == "keep"
    feed(h, 2 * H.PROBE_BATCHES, 320 * US, 320 * US, 160 * US, made_here=True)
    assert h._phase == "keep"
    feed(h, H.PROBE_BATCHES, 340 * US, 340 * US, 160 * US, made_here=True)
    assert h._phase == "keep"  # one measure over: a pause, maybe
    feed(h, H.PROBE_BATCHES, 340 * US, 340 * US, 160 * US, made_here=True)
    assert h._phase == "measure" and h.to_workers


def test_the_measure_that_can_hand_batches_over_spans_several_time_slices(monkeypatch):
    """2 processes making HDF5 rows at 73 us a batch, beside the consumer on 2 cores: one wait
    for a time slice (3.6 ms) among the 32 cycles of their second measure read them at 180 us
    a batch, slower than the consumer's 118 us, which then made every batch. That measure goes
    on until it spans ``CONFIRM_SECONDS`` (the first only decides on a probe)."""
    monkeypatch.setattr(H, "CONFIRM_SECONDS", 20 * MS)
    h = H.MeasuredHandoff(settle=0, workers=2)
    feed(h, H.PROBE_BATCHES, 125 * US, 100 * US, 140 * US)  # a stall in the first: a probe
    assert h._phase == "probe"
    feed(h, 1 + H.PROBE_BATCHES, 118 * US, 118 * US, 110 * US, made_here=True)
    assert h._phase == "confirm"
    feed(h, 1, 3.6 * MS, 3.6 * MS, 140 * US)
    feed(h, H.PROBE_BATCHES - 1, 73 * US, 40 * US, 140 * US)
    assert h._phase == "confirm"  # 32 batches, 5.9 ms
    more = int((20 * MS - 3.6 * MS) / (73 * US)) - (H.PROBE_BATCHES - 1)
    feed(h, more, 73 * US, 40 * US, 140 * US)
    assert h._phase == "confirm"
    feed(h, 1, 73 * US, 40 * US, 140 * US)
    assert h._phase == "keep" and h.to_workers
    assert h._again_cycle == pytest.approx((3.6 * MS + (more + 32) * 73 * US) / (more + 33))


def test_a_slower_consumer_keeps_the_workers():
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 10 * US, 9 * US, 9 * US)
    feed(h, 1 + H.PROBE_BATCHES, 12 * US, 12 * US, 9 * US, made_here=True)  # slower, below the abort ratio
    reconfirmed(h, 10 * US)


def test_workers_measured_clearly_faster_are_measured_again_before_they_keep_the_batches():
    """Two threads on shuffled HDF5 rows (h5py holds the GIL: they never beat the consumer)
    measured 239 us a batch, the consumer's probe after them 283 us: one measure each, the
    workers clearly faster. Measured again, they make batches at 284 us, and the consumer takes
    the batches; measured again as fast as the first time, they keep them."""
    for again, to_workers in ((284 * US, False), (239 * US, True)):
        h = H.MeasuredHandoff(settle=0, workers=2)
        feed(h, H.PROBE_BATCHES, 239 * US, 230 * US, 478 * US)
        feed(h, 1 + H.PROBE_BATCHES, 283 * US, 283 * US, 270 * US, made_here=True)
        assert h._phase == "confirm" and h.to_workers
        feed(h, H.PROBE_BATCHES, again, again, 478 * US)
        feed(h, 1, 283 * US, 283 * US, 270 * US, made_here=not to_workers)  # the consumer's first, if it took over
        assert h._phase == "keep" and h.to_workers is to_workers


def test_a_pause_in_the_probe_does_not_hand_the_batches_to_slower_workers():
    """Two of the consumer's probe batches caught a pause (2.1 ms among 630 us): counted whole,
    they make workers measured at 600 us look clearly faster (the consumer at 735 us). They count
    at the median, so the workers are measured again, lose, and the consumer keeps the batches."""
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 600 * US, 590 * US, 600 * US)
    feed(h, 1 + H.ABORT_AFTER, 630 * US, 630 * US, 630 * US, made_here=True)  # the transition, warming up
    feed(h, H.PROBE_BATCHES - H.ABORT_AFTER - 2, 630 * US, 630 * US, 630 * US, made_here=True)
    assert h._phase == "probe"
    feed(h, 2, 2.1 * MS, 2.1 * MS, 630 * US, made_here=True)
    assert h._phase == "confirm"
    confirmed(h, 600 * US)  # counted whole (a mean of 735 us), the workers' 600 us had won
    assert not h.to_workers and h._phase == "keep"


def test_the_consumers_own_work_between_batches_is_no_pause():
    """A callback every seventh step (3 ms outside the loader) slows the consumer's cycles
    whoever makes the batches: it stays in the probe's mean, and the workers keep the batches."""
    h = H.MeasuredHandoff(settle=0, workers=2)
    feed(h, H.PROBE_BATCHES, 900 * US, 850 * US, 1200 * US)
    feed(h, 1 + H.ABORT_AFTER, 600 * US, 600 * US, 600 * US, made_here=True)
    for k in range(H.PROBE_BATCHES - H.ABORT_AFTER):
        feed(h, 1, 3.6 * MS if k % 7 == 6 else 600 * US, 600 * US, 600 * US, made_here=True)
    reconfirmed(h, 900 * US)  # 1.03 ms a cycle here against 0.9 ms


def test_the_choice_is_measured_again_after_batches_and_seconds(monkeypatch):
    monkeypatch.setattr(H, "RECHECK_BATCHES", 10)
    monkeypatch.setattr(H, "RECHECK_SECONDS", 1.0)
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 10 * MS, 0.1 * MS, 5 * MS)
    feed(h, 20, 10 * MS, 0.1 * MS, 5 * MS)  # 20 batches but 0.2 s: too soon
    assert h._phase == "keep"
    feed(h, 80, 10 * MS, 0.1 * MS, 5 * MS)
    assert h._phase == "measure" and h.to_workers


def test_a_lost_worker_pins_every_batch_to_the_workers():
    h = measured(settle=0)
    feed(h, H.PROBE_BATCHES, 30 * US, 25 * US, 10 * US)
    assert not h.to_workers
    h.pin_to_workers()
    feed(h, 1 + H.PROBE_BATCHES, 1 * US, 1 * US, 10 * US, made_here=True)
    h.new_epoch(LONG_EPOCH)
    feed(h, 10 * H.PROBE_BATCHES, 30 * US, 25 * US, 10 * US)
    assert h.to_workers and h._phase == "pinned"


def test_a_new_epoch_settles_a_measurement_again_but_keeps_what_it_measured():
    h = measured(settle=2)
    feed(h, 2 + H.PROBE_BATCHES - 1, 10 * US, 9 * US, 9 * US)
    h.new_epoch(LONG_EPOCH)  # the pipeline starts empty again: its refill is not counted
    feed(h, 2, 500 * US, 9 * US, 9 * US)
    assert h._phase == "measure"
    feed(h, 1, 10 * US, 9 * US, 9 * US)  # the measure's last cycle
    assert h._phase == "probe" and h._pooled_cycle == pytest.approx(10 * US)
    h.new_epoch(LONG_EPOCH)
    assert h._phase == "probe"


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(workers=0), (H.FixedHandoff, False)),
        (dict(workers=2), (H.MeasuredHandoff, True)),
        (dict(workers=2, timeout=5.0), (H.FixedHandoff, True)),
        (dict(workers=2, mode="process"), (H.MeasuredHandoff, True)),
        (dict(workers=2, mode="process", inline_when_faster=True), (H.MeasuredHandoff, True)),
        (dict(workers=2, inline_when_faster=False), (H.FixedHandoff, True)),
        (dict(workers=2, mode="ray"), (H.FixedHandoff, True)),
    ],
)
def test_which_handoff_a_configuration_gets(kwargs, expected):
    handoff = H.make_handoff(LoaderConfig.build(batch_size=4, **kwargs))
    assert (type(handoff), handoff.to_workers) == expected


@pytest.mark.parametrize("mode,windows", [("thread", 1), ("process", 2)])
def test_a_measure_skips_one_window_of_tasks_two_where_processes_also_make_their_slots(mode, windows):
    """4 threads skipping two windows (256 batches of 8 a task) decided only in the next epoch."""
    config = LoaderConfig.build(batch_size=4, workers=4, mode=mode)
    handoff = H.make_handoff(config, per_task=lambda: 8)
    assert handoff.settle == windows * config.execution.effective_prefetch * 8
    feed(handoff, handoff.settle + H.MEASURE_ROUNDS * 4 * 8, 30 * US, 25 * US, 10 * US)
    assert handoff._phase == "probe"


def test_the_loader_says_who_makes_its_batches():
    assert Loader(paired_source(8), 4).handoff == "inline"  # workers=0
    assert Loader(paired_source(8), 4, workers=2, inline_when_faster=False).handoff == "workers"
    with Loader(paired_source(4000), 4, workers=1) as loader:
        assert loader.handoff == loader.stats()["handoff"] == "deciding"  # nothing measured yet
        states = [loader.handoff for _ in loader]
    decided = states.index(next(s for s in states if s != "deciding"))
    # 16 batches for grouping.py's "auto" to pick, then per measure of the workers a skip of two
    # windows of tasks (64 batches) and 32 timed, twice when the probe's consumer comes out
    # faster, with the probe (33) and the window in flight drained (32) between: at most ~310,
    # whichever way the measures go. Within the first half of the epoch, not on a measured speed
    assert 0 < decided < len(states) // 2 and set(states[decided:]) <= {"inline", "workers", "deciding"}
    # kept, but for at most one second look when the way kept drifts slower (then kept till a recheck)
    looks = sum(a != "deciding" and b == "deciding" for a, b in zip(states[decided:], states[decided + 1 :]))
    assert looks <= 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(workers=2, timeout=1.0, inline_when_faster=True), "cannot be interrupted"),
        (dict(workers=2, mode="ray", inline_when_faster=True), "not Ray"),
    ],
)
def test_contradicting_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoaderConfig.build(batch_size=4, **kwargs)


# -- the loader with a scripted handoff ------------------------------------------------------
class ScriptedHandoff:
    """Flips between workers and consumer on a fixed pattern of batch counts."""

    deciding = False

    def __init__(self, pattern):
        self.pattern, self.count, self.to_workers = list(pattern), 0, bool(pattern[0])
        self.epochs = []  # the batches each epoch was to hand out, as new_epoch heard them

    def new_epoch(self, batches):
        self.epochs.append(batches)

    def pin_to_workers(self):
        pass  # ignored, so the scheduler's own rule for lost batches is what is tested

    def record(self, cycle, in_loader, timings, made_here):
        self.count += 1
        self.to_workers = bool(self.pattern[self.count % len(self.pattern)])


def scripted(monkeypatch, pattern):
    monkeypatch.setattr(loader_module, "make_handoff", lambda config, **_: ScriptedHandoff(pattern))


def digests(loader, epochs=2):
    out = []
    for e in range(epochs):
        for b in loader.epoch(e):
            out.append((int(b["id"][0]), b["x"].tobytes(), b["y"].tobytes(), b["id"].tobytes()))
    return out


def reference(n, **kwargs):
    with Loader(paired_source(n), 5, with_ids=True, **kwargs) as loader:
        return digests(loader)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.lists(st.booleans(), min_size=1, max_size=6), n=st.integers(1, 60), shuffle=st.booleans())
def test_any_mix_of_inline_and_worker_batches_is_bit_identical(monkeypatch, pattern, n, shuffle):
    options = dict(shuffle=shuffle, seed=3, transform=noisy)
    expected = reference(n, **options)
    with monkeypatch.context() as patch:  # hypothesis reuses the fixture across examples
        scripted(patch, pattern)
        with Loader(paired_source(n), 5, with_ids=True, workers=2, **options) as loader:
            got = digests(loader)
    assert got == expected


def test_each_epoch_tells_the_handoff_how_many_batches_it_hands_out(monkeypatch):
    scripted(monkeypatch, [True])
    with Loader(paired_source(25), 5, workers=2) as loader:  # 5 batches an epoch
        list(loader.epoch(0))
        loader.seek(1, 3)  # resumed: 2 batches left
        assert len(list(loader)) == 2
        assert loader._handoff.epochs == [5, 2]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_long_phases_hand_batches_both_ways(monkeypatch, mode):
    expected = reference(97, shuffle=True, seed=5, transform=noisy)
    scripted(monkeypatch, [False] * 6 + [True] * 3)
    with Loader(
        paired_source(97),
        5,
        with_ids=True,
        workers=2,
        mode=mode,
        inline_when_faster=True,
        shuffle=True,
        seed=5,
        transform=noisy,
    ) as loader:
        assert digests(loader) == expected
        stats = loader.stats()
    assert 0 < stats["inline_batches"] < stats["batches"]  # both ways were taken


def test_a_failing_sample_made_inline_is_reported_like_anywhere_else(monkeypatch, marker_dir):
    scripted(monkeypatch, [False])
    with Loader(FaultySource(40, fail={13}, marker_dir=marker_dir), 4, workers=2, with_ids=True) as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
        assert loader.stats()["inline_batches"] > 0
    assert (info.value.sample_id, info.value.batch_index, info.value.attempts) == (13, 3, 1)
    with Loader(
        FaultySource(40, fail={13}, marker_dir=marker_dir), 4, workers=2, with_ids=True, on_error="skip"
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        assert [r["sample_id"] for r in loader.quarantine_report()] == [13]
    assert sorted(ids.tolist()) == sorted(set(range(40)) - {13})


class PidRecordingSource(FaultySource):
    """Leaves a marker ``read-<id>-<pid>`` each time a watched sample is read."""

    def __init__(self, *args, watch=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.watch = set(watch)

    def __getitem__(self, i):
        if i in self.watch:
            open(os.path.join(self.marker_dir, f"read-{i}-{os.getpid()}"), "w").close()
        return super().__getitem__(i)


def test_a_batch_whose_worker_died_never_runs_in_the_consumer(monkeypatch, marker_dir, no_leaks):
    """Sample 9 kills its worker once; its batch is re-run, and never by the consumer, which
    the next killing sample would take down with it."""
    scripted(monkeypatch, [True] + [False] * 99)  # the first window goes to workers, then none
    source = PidRecordingSource(40, kill={9}, watch={8, 9, 10, 11}, marker_dir=marker_dir, slow=0.002)
    # a window of 4 of the 10 batches: the switch comes as the second batch is handed out, and
    # the batches planned after it (6 to 9 at least) are the consumer's (with the default 8,
    # workers fast enough to take 8 and 9 before then left none)
    with Loader(
        source, 4, workers=2, mode="process", prefetch=4, inline_when_faster=True, with_ids=True, retries=1
    ) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        assert loader.stats()["inline_batches"] > 0
    assert sorted(ids.tolist()) == list(range(40))
    readers = {name.rsplit("-", 1)[1] for name in os.listdir(marker_dir) if name.startswith("read-")}
    assert readers and str(os.getpid()) not in readers


def test_a_lost_worker_ends_inline_making_for_the_loader(marker_dir, no_leaks):
    with Loader(FaultySource(40, kill={9}, marker_dir=marker_dir), 4, workers=2, mode="process", retries=1) as loader:
        list(loader)
        assert loader._handoff.to_workers and loader._handoff._phase == "pinned"


def test_a_measure_in_progress_skips_one_window_at_each_epochs_start_and_ends():
    """2 processes, tasks of 11 batches, 157 batches an epoch (5,000 JPEGs of 32): after the
    start (two windows, 176 batches) each epoch's refill is one window (88) cut to half the
    epoch (78), so the 79 after it measure the workers; two windows each time skipped every
    batch of every epoch."""
    config = LoaderConfig.build(batch_size=4, workers=2, mode="process")
    handoff = H.make_handoff(config, per_task=lambda: 11)
    window = config.execution.effective_prefetch * 11
    assert handoff.settle == 2 * window and handoff.refill == window < 157 < handoff.settle
    handoff.new_epoch(157)
    feed(handoff, 157, 3 * MS, 10 * US, 6 * MS)  # the first epoch: all of it skipped
    assert handoff._phase == "measure"
    handoff.new_epoch(157)
    feed(handoff, 157, 3 * MS, 10 * US, 6 * MS)
    assert handoff._phase == "keep" and handoff.to_workers  # the workers hide the work: kept


def test_the_first_epoch_does_not_cut_the_skip_after_a_start():
    """The loader starts every epoch with ``new_epoch``, its first too: the two windows that a
    fresh pool of processes skips (its first tasks also make the workers' slots) are not cut
    to the one window of a later epoch's refill."""
    config = LoaderConfig.build(batch_size=4, workers=2, mode="process")
    handoff = H.make_handoff(config, per_task=lambda: 1)
    assert handoff.settle == 2 * handoff.refill
    handoff.new_epoch(LONG_EPOCH)
    measure = max(H.PROBE_BATCHES, H.MEASURE_ROUNDS * 2)
    feed(handoff, handoff.settle + measure - 1, 30 * US, 25 * US, 10 * US)
    assert handoff._phase == "measure"
    feed(handoff, 1, 30 * US, 25 * US, 10 * US)
    assert handoff._phase == "probe"


def run_epochs(handoff, epochs, batches, workers_cycle, here_cycle):
    """``epochs`` epochs of ``batches`` as the scheduler hands them out: made where the handoff
    says, workers' batches with ``workers_cycle`` (most of it spent waiting inside the
    loader), the consumer's with ``here_cycle``; each batch is 10 us of work."""
    for _ in range(epochs):
        handoff.new_epoch(batches)
        for _ in range(batches):
            here = not handoff.to_workers
            cycle = here_cycle if here else workers_cycle
            handoff.record(cycle, cycle if here else 0.9 * cycle, {"read": 10 * US}, here)


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize(
    "workers_cycle,here_cycle,to_workers",
    [
        pytest.param(10 * US, 30 * US, True, id="workers-faster"),
        pytest.param(30 * US, 10 * US, False, id="consumer-faster"),
    ],
)
def test_epochs_shorter_than_a_window_of_tasks_still_decide(mode, workers_cycle, here_cycle, to_workers):
    """2,000 JPEGs of 32 are 63 batches an epoch, fewer than a window of tasks of 11 skips: a
    refill cut to half an epoch leaves each epoch something to measure (or to confirm), so
    the loader decides instead of saying "deciding" for good."""
    config = LoaderConfig.build(batch_size=4, workers=2, mode=mode)
    handoff = H.make_handoff(config, per_task=lambda: 11)
    assert handoff.refill > 63
    run_epochs(handoff, 30, 63, workers_cycle, here_cycle)
    assert handoff._phase == "keep" and handoff.to_workers == to_workers and not handoff.deciding
