"""Keras's own PyDataset tests (v3.15.1), adapted to ``as_keras()`` in ``tests/keras_peer/``, on every backend.

Each backend runs the folder in a pytest subprocess of its own (``KERAS_BACKEND`` is fixed per
process). A case may only be skipped for a reason argued in the folder (its README lists them);
every other case must pass.
"""

from __future__ import annotations

import importlib.util
import re

import keras_runs
import pytest

# the cases that apply per backend: upstream skips multiprocessing on JAX and TF, and on JAX the
# case built on jax.Array inputs expects jax.Array batches
PASSING = {"jax": 20, "tensorflow": 23, "torch": 25}
ARGUED = (
    "a Loader is finite by design",
    "a timed assertion",
    "numpy arrays its workers made",
    "Starting processes is slow",
    "upstream skips it",
    "not supported with JAX backend",
    "hangs on Tensorflow",
)


@pytest.mark.timeout(keras_runs.WAIT_TIMEOUT + 60)
@pytest.mark.parametrize("backend", keras_runs.BACKENDS)
def test_keras_pydataset_tests_pass_on_as_keras(request, backend):
    for module in ("tensorflow", "jax", "torch"):  # upstream's test files import all three
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    done = keras_runs.result(request, "peer", backend)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    skipped = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", output, flags=re.M)
    assert all(any(reason in line for reason in ARGUED) for line in skipped), skipped
    assert int(re.search(r"(\d+) passed", output).group(1)) == PASSING[backend], output[-3000:]
