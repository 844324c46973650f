"""The Keras subprocesses of the suite: each script once per backend, two at a time.

Each backend needs a process of its own (``KERAS_BACKEND`` is fixed when Keras is imported), and
a process spends most of its life importing a framework and tracing functions, one core at a
time. So the first test that needs any of them starts every run the session will need (two at
once, on two cores), and each test then waits for its own. What a run prints is its result:
``REPORT {json}`` for the scripts, pytest's summary for the peer tests.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
BACKENDS = ("jax", "tensorflow", "torch")
RUN_TIMEOUT = 600  # one run, on a busy 2-core machine; each takes 20-60 s on idle cores
WAIT_TIMEOUT = 3 * RUN_TIMEOUT  # a test may wait behind the runs queued before its own

# kind -> (the test module that reads it, the command); the order is the order tests ask
COMMANDS = {
    "calls": ("test_keras_calls", [sys.executable, str(TESTS / "keras_scripts" / "run_calls.py")]),
    "backend": ("test_keras_integration", [sys.executable, str(TESTS / "keras_scripts" / "run_backend.py")]),
    "label_noise": ("test_keras_label_noise", [sys.executable, str(TESTS / "keras_scripts" / "run_label_noise.py")]),
    "peer": (
        "test_keras_peer",
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            str(TESTS / "keras_peer"),
        ],
    ),
}
_lock = threading.Lock()
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="keras-run")
_runs: dict[tuple[str, str], concurrent.futures.Future] = {}


def missing(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    for module in ("keras", backend):
        if importlib.util.find_spec(module) is None:
            return f"KERAS_BACKEND={backend}: {module} is not installed"
    return None


def _run(kind: str, backend: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "STEADYFEED_KERAS_PEER": "1"}
    try:
        return subprocess.run(COMMANDS[kind][1], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as expired:
        return subprocess.CompletedProcess(
            expired.cmd, -1, str(expired.stdout or ""), f"timed out after {RUN_TIMEOUT} s\n{expired.stderr or ''}"
        )


def start(session) -> None:
    """Start every run that the collected tests of ``session`` will ask for (once per session)."""
    wanted = {item.module.__name__ for item in session.items if getattr(item, "module", None) is not None}
    with _lock:
        for kind, (module, _) in COMMANDS.items():
            if module in wanted:
                for backend in BACKENDS:
                    if (kind, backend) not in _runs and missing(backend) is None:
                        _runs[kind, backend] = _pool.submit(_run, kind, backend)


def result(request, kind: str, backend: str) -> subprocess.CompletedProcess:
    """The finished run of ``kind`` on ``backend`` (skips the test when the backend is missing)."""
    reason = missing(backend)
    if reason:
        pytest.skip(reason)
    start(request.session)
    with _lock:
        future = _runs.get((kind, backend)) or _runs.setdefault((kind, backend), _pool.submit(_run, kind, backend))
    return future.result(timeout=WAIT_TIMEOUT)


def report(request, kind: str, backend: str) -> dict:
    """The ``REPORT {json}`` a script printed; the test fails with its output when there is none."""
    done = result(request, kind, backend)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    if done.returncode != 0 or not lines:
        pytest.fail(f"{backend}: {kind} failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("REPORT ") :])
