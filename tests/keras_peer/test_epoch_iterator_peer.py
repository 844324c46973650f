"""Mirrors keras v3.15.1 ``keras/src/trainers/epoch_iterator_test.py`` (see README.md), its PyDataset
case ``test_epoch_callbacks``: Keras's EpochIterator over ``as_keras()`` calls the dataset's
epoch hooks in order, once per epoch."""

import numpy as np
import pytest
from keras.src.trainers import epoch_iterator  # what upstream's test drives
from peer_data import arrays_source

import steadyfeed as sf
from steadyfeed.keras import KerasDataset


class Tracking(KerasDataset):
    """Upstream's TestPyDataset: records on_epoch_begin (1) and on_epoch_end (2)."""

    def __init__(self, loader, **kwargs):
        super().__init__(loader, **kwargs)
        self.tracker = []

    def on_epoch_begin(self):
        super().on_epoch_begin()
        self.tracker.append(1)

    def on_epoch_end(self):
        super().on_epoch_end()
        self.tracker.append(2)


@pytest.mark.parametrize("infinite", [True, False], ids=["infinite", "finite"])
def test_epoch_callbacks(infinite):
    if infinite:
        pytest.skip("a Loader is finite by design: an epoch is a plan of batches")
    ds = Tracking(sf.Loader(arrays_source(x=np.random.rand(64, 2)), 16), y=None)
    epoch_iter = epoch_iterator.EpochIterator(x=ds, steps_per_epoch=10)
    num_epochs = 5
    for _ in range(num_epochs):
        for _, _, _ in epoch_iter:
            pass
    assert ds.tracker == [1, 2] * num_epochs
    ds.close()
