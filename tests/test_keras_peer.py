"""Keras's own PyDataset tests (v3.15.1), adapted to ``as_keras()`` in ``tests/keras_peer/``, on every backend.

Each backend runs the folder in a pytest subprocess of its own (``KERAS_BACKEND`` is fixed per
process). A case may only be skipped for a reason argued in the folder (its README lists them);
every other case must pass.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PEER = Path(__file__).parent / "keras_peer"
BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
TIMEOUT = 400
# the cases that apply per backend: upstream skips multiprocessing on JAX and TF, and on JAX the
# case built on jax.Array inputs expects jax.Array batches
PASSING = {"jax": 20, "tensorflow": 23, "torch": 25}
ARGUED = ("a Loader is finite by design", "a timed assertion", "numpy arrays its workers made",
          "Starting processes is slow", "upstream skips it", "not supported with JAX backend", "hangs on Tensorflow")


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend", sorted(BACKEND_MODULES))
def test_keras_pydataset_tests_pass_on_as_keras(backend):
    for module in ("keras", "tensorflow", "jax", "torch"):  # upstream's test files import all three
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "STEADYFEED_KERAS_PEER": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-W", "ignore",
                           str(PEER)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    skipped = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", output, flags=re.M)
    assert all(any(reason in line for reason in ARGUED) for line in skipped), skipped
    assert int(re.search(r"(\d+) passed", output).group(1)) == PASSING[backend], output[-3000:]
