"""Mirrors keras v3.15.1 ``keras/src/trainers/trainer_test.py`` (see README.md), the ``py_dataset``
cases of ``test_fit_with_data_adapter``: ``model.fit`` over ``as_keras()`` runs 3 epochs."""

import keras
import numpy as np
import pytest
from peer_data import arrays_source

import steadyfeed as sf

BACKEND = keras.backend.backend()
FINITE = "a Loader is finite by design: an epoch is a plan of batches"

CASES = [
    dict(testcase_name="py_dataset"),
    dict(testcase_name="py_dataset_cw", fit_kwargs={"class_weight": {0: 1, 1: 2}}),
    dict(testcase_name="py_dataset_infinite", dataset_kwargs={"infinite": True}, fit_kwargs={"steps_per_epoch": 20}),
    dict(
        testcase_name="py_dataset_infinite_cw",
        dataset_kwargs={"infinite": True},
        fit_kwargs={"steps_per_epoch": 20, "class_weight": {0: 1, 1: 2}},
    ),
    dict(testcase_name="py_dataset_multithreading", dataset_kwargs={"workers": 2}),
    dict(
        testcase_name="py_dataset_multithreading_cw",
        dataset_kwargs={"workers": 2},
        fit_kwargs={"class_weight": {0: 1, 1: 2}},
    ),
    dict(
        testcase_name="py_dataset_multithreading_infinite",
        dataset_kwargs={"infinite": True, "workers": 2},
        fit_kwargs={"steps_per_epoch": 20},
    ),
    dict(testcase_name="py_dataset_multiprocessing", dataset_kwargs={"workers": 2, "use_multiprocessing": True}),
    dict(
        testcase_name="py_dataset_multiprocessing_cw",
        dataset_kwargs={"workers": 2, "use_multiprocessing": True},
        fit_kwargs={"class_weight": {0: 1, 1: 2}},
    ),
    dict(
        testcase_name="py_dataset_multiprocessing_infinite",
        dataset_kwargs={"infinite": True, "workers": 2, "use_multiprocessing": True},
        fit_kwargs={"steps_per_epoch": 20},
    ),
]


class ExampleModel(keras.Model):
    """Upstream's ExampleModel: a Dense layer of ``units`` with all-ones kernel and no bias, as a trainer."""

    def __init__(self, units):
        super().__init__()
        self.dense = keras.layers.Dense(units, use_bias=False, kernel_initializer="ones")

    def call(self, x):
        return self.dense(x)


def py_dataset(infinite=False, workers=0, use_multiprocessing=False):
    """Upstream's TestPyDataset: 20 batches of ones((5, 4)), zeros((5, 3))."""
    assert not infinite
    source = arrays_source(x=np.ones((100, 4), "float32"), y=np.zeros((100, 3), "float32"))
    return sf.Loader(source, 5, workers=workers, mode="process" if use_multiprocessing else "thread").as_keras()


@pytest.mark.parametrize("case", CASES, ids=[c["testcase_name"] for c in CASES])
def test_fit_with_data_adapter(case):
    dataset_kwargs, fit_kwargs = case.get("dataset_kwargs", {}), case.get("fit_kwargs", {})
    if dataset_kwargs.get("infinite"):
        pytest.skip(FINITE)
    if dataset_kwargs.get("use_multiprocessing"):
        if BACKEND == "jax":
            pytest.skip("Multiprocessing not supported with JAX backend")  # upstream's own skip
        if BACKEND == "tensorflow":
            pytest.skip("Multiprocessing hangs on Tensorflow")  # upstream's own skip
    model = ExampleModel(units=3)
    # torch.compile takes ~12 s a model on 2 cores; the data path under test is the same without it
    jit_compile = BACKEND != "torch"
    model.compile(
        optimizer=keras.optimizers.Adagrad(),
        loss=keras.losses.MeanSquaredError(),
        metrics=[keras.metrics.MeanSquaredError()],
        jit_compile=jit_compile,
    )
    x = py_dataset(**dataset_kwargs)
    model.fit(x, None, epochs=3, **fit_kwargs)
    x.close()
