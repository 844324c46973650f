"""KerasFeed on its own: the call sequences Keras 3.15 makes on each backend, replayed.

Each script is what a PyDataset saw (``tests/keras_scripts`` records the same with real fits):
``B``/``E`` on_epoch_begin/end, ``N`` a num_batches read and ``G`` a batch asked for, both
from the thread that began the epoch, ``n``/``g`` the same from another thread (tf.data's).
The loader has 4 batches per epoch of 4 ids each, so a batch is named by (epoch, index).
"""

import threading

import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed.errors import DataError
from steadyfeed.integration.feed import KEEP, KerasFeed

pytestmark = pytest.mark.timeout(60)

B = 4  # batches per loader epoch


class Recorder:
    def __init__(self, feed):
        self.feed, self.served, self.reported = feed, [], []
        feed.report = lambda position, batch: self.reported.append(position)

    def run(self, script: str) -> list:
        """Replay ``script``; returns what each G/g got: (epoch, index), or None (computed alone)."""
        got = []
        for op in script.split():
            call = {
                "B": self.feed.begin,
                "E": self.feed.end,
                "N": self.feed.length,
                "n": self.feed.length,
                "G": self._take,
                "g": self._take,
            }[op]
            if op in "ng":
                thread = threading.Thread(target=lambda call=call, op=op: got.append(call()) if op == "g" else call())
                thread.start()
                thread.join()
            elif op == "G":
                got.append(call())
            else:
                call()
        return got

    def _take(self):
        taken = self.feed.take()
        if taken is None:
            return None
        position, batch = taken
        ids = batch["id"]
        assert ids.tolist() == list(range(4 * position[1], 4 * position[1] + 4)), "batch does not match its position"
        return position


def feed(steps=None, **options):
    loader = sf.Loader(sf.ArraySource(x=np.arange(4 * B)), 4, with_ids=True, **options)
    return Recorder(KerasFeed(loader, steps))


def epoch(e, indices=range(B)):
    return [(e, i) for i in indices]


def test_jax_and_torch_fit_build_probe_is_served_again_and_reported_once():
    r = feed()
    probe = r.run("N N B N N G N E")
    first = r.run("B N N G G G G N E")
    second = r.run("B N N G G G G N E")
    assert probe == epoch(0, [0]) and first == epoch(0) and second == epoch(1)
    assert r.reported == epoch(0) + epoch(1)  # the probe's batch, served again, is reported once


def test_tensorflow_fit_signature_reads_take_nothing_from_the_stream():
    r = feed()
    signature = r.run("N N N G G N E")  # get_tf_dataset reads two batches for its signature, then reset()
    assert signature == [None, None]
    assert r.run("B n n g g g g E") == epoch(0) and r.run("B n n g g g g E") == epoch(1)


def test_tensorflow_strategy_probe_that_prefetched_a_whole_pass_is_served_again():
    r = feed()
    assert r.run("N N N G G B n n g g g g N E") == [None, None] + epoch(0)  # a probe: tf.data pulled all
    assert r.run("B n n g g g g E") == epoch(0) and r.run("B n n g g g g E") == epoch(1)
    assert r.reported == epoch(0) + epoch(1)


def test_keras_steps_per_epoch_carries_one_pass_across_its_epochs():
    r = feed()  # fit(steps_per_epoch=3) on JAX: Keras epochs of 3, 1 (the loader epoch ends), 3
    r.run("N N B N N G N E")
    assert r.run("B N N G G G E") == epoch(0, [0, 1, 2])
    assert r.run("B G N E") == epoch(0, [3])
    assert r.run("B N G G G E") == epoch(1, [0, 1, 2])


def test_tensorflow_prefetch_across_keras_epochs_loses_nothing():
    r = feed()  # fit(steps_per_epoch=3) on TF: tf.data pulls all 4 in the first Keras epoch
    r.run("N N N G G N E")
    assert r.run("B n n g g g g E") == epoch(0) and r.run("B E") == []
    assert r.run("B n n g g g g E") == epoch(1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stopped_fit_then_evaluate_gets_the_whole_epoch_then_fit_the_next(workers):
    r = feed(workers=workers)
    r.run("N N B N N G N E")
    assert r.run("B N N G G") == epoch(0, [0, 1])  # stop_training after batch 1: the epoch stays open
    assert r.run("N N N E B N N G G G G N E") == epoch(0)  # evaluate: its reads arrive inside the open epoch
    assert r.run("N N N E B N N G G G G N E") == epoch(1)  # the next fit
    assert r.reported == epoch(0) + epoch(1)


def test_tensorflow_stopped_fit_then_evaluate():
    r = feed()
    r.run("N N N G G N E")
    r.run("B n n g g g g")  # stopped at batch 1, tf.data had pulled the whole pass
    assert r.run("N N N G G N E B n n g g g g E") == [None, None] + epoch(0)


def test_a_call_after_one_cut_short_by_steps_starts_the_next_loader_epoch():
    r = feed()  # evaluate(steps=2), then evaluate(): the second gets a whole epoch
    r.run("N N B N N G N E")
    assert r.run("B N N G G E") == epoch(0, [0, 1])
    assert r.run("N N N E B N N G G G G N E") == epoch(1)


def test_a_rollback_longer_than_what_is_kept_is_recomputed_identically():
    r = Recorder(KerasFeed(sf.Loader(sf.ArraySource(x=np.arange(40)), 4, with_ids=True, workers=2), None))
    assert r.run("B N N " + "G " * (KEEP + 2)) == [(0, i) for i in range(KEEP + 2)]  # then abandoned
    assert r.run("N E B N N " + "G " * 10 + "N E") == [(0, i) for i in range(10)]
    assert r.reported == [(0, i) for i in range(10)]


def test_a_position_set_from_outside_is_where_the_next_pass_starts():
    r = feed()
    r.run("B N N G G G G N E")
    r.feed.loader.seek(3, 2)  # e.g. LoaderCheckpoint restoring a saved position
    assert r.feed.length() == B  # Keras's bound and progress bar: a whole epoch
    assert r.run("B N N G G E") == epoch(3, [2, 3])
    assert r.run("B N N G G G G N E") == epoch(4)


def test_steps_given_to_the_feed_cross_loader_epochs():
    r = feed(steps=3)
    assert r.feed.length() == 3
    got = [r.run("B N N G G G N E") for _ in range(3)]
    assert got == [[(0, 0), (0, 1), (0, 2)], [(0, 3), (1, 0), (1, 1)], [(1, 2), (1, 3), (2, 0)]]


def test_trained_gives_the_cursor_after_each_batch_in_order():
    r = feed()
    r.run("N N B N N G N E B N N G G G")
    assert r.feed.trained(2) == [(0, 1), (0, 2)] and r.feed.trained(5) == [(0, 3)]


def test_batches_left_out_under_skip_are_named_when_keras_expects_more():
    class LastBatchFails:
        def __len__(self):
            return 16

        def __getitem__(self, i):
            if i >= 12:  # every sample of the last batch
                raise ValueError("bad")
            return {"x": np.int64(i)}

    loader = sf.Loader(LastBatchFails(), 4, with_ids=True, on_error="skip", max_error_fraction=0.5)
    r = Recorder(KerasFeed(loader, None))
    assert r.run("B N N G G G") == epoch(0, [0, 1, 2])
    with pytest.raises(DataError, match="left out whole batches .4 samples of this epoch failed"):
        r.run("G")


def test_outside_an_epoch_nothing_is_taken():
    r = feed()
    assert r.run("G G N") == [None, None] and r.feed.loader.cursor == (0, 0)


def test_batches_kept_for_serving_again_are_copies():
    """A pass keeps its first KEEP batches for the whole pass; a process worker lends only a
    few batches at once (``shm.LENT_SLOTS``) and copies the rest, so a kept lent batch would
    cost every later batch a copy. The feed keeps copies; the batch served again is equal."""
    loader = sf.Loader(sf.ArraySource(x=np.arange(40.0)), 4, with_ids=True, workers=2, mode="process")
    try:
        f = KerasFeed(loader)
        f.length(), f.begin(), f.length()
        probe = f.take()
        f.length(), f.end()  # Keras's build probe: the pass is rolled back
        f.begin(), f.length()
        again = f.take()
        f.end()
    finally:
        loader.close()
    assert probe[0] == again[0] == (0, 0)
    np.testing.assert_array_equal(again[1]["x"], probe[1]["x"])
    assert not np.shares_memory(again[1]["x"], probe[1]["x"])
