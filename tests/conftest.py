import gc
import multiprocessing.resource_tracker as resource_tracker
import os
import threading
import time

import psutil
import pytest
from helpers import child_processes

from steadyfeed.execution import shm

# Keras's own PyDataset tests run once per backend in a subprocess of their own (test_keras_peer.py)
collect_ignore = [] if os.environ.get("STEADYFEED_KERAS_PEER") else ["keras_peer"]


def _our_children():
    return [child.pid for child in child_processes()]


def _our_segments():
    if not os.path.isdir("/dev/shm"):
        return []
    mine = f"{shm.PREFIX}{os.getpid():x}"
    return [name for name in os.listdir("/dev/shm") if name.startswith(mine)]


def _our_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("steadyfeed-") and t.is_alive()]


def snapshot():
    return {
        "children": _our_children(),
        "threads": _our_threads(),
        "segments": _our_segments(),
        "fds": psutil.Process().num_fds(),
    }


@pytest.fixture(scope="session", autouse=True)
def _tracker_started():
    resource_tracker.ensure_running()  # once per session: its pipe is not a leak of ours


@pytest.fixture
def no_leaks():
    """After the test: no worker process, worker thread, shared-memory segment or extra fd remains."""
    before = snapshot()
    yield
    deadline = (
        time.monotonic() + 60
    )  # a grace period for a loaded machine (workers run niced), left as soon as it holds
    while True:
        after = snapshot()
        clean = (
            not after["children"] and not after["threads"] and not after["segments"] and after["fds"] <= before["fds"]
        )
        if clean or time.monotonic() > deadline:
            break
        # a lent batch (views of a worker's shared memory, holding its own map of it) that an
        # exception's traceback keeps in a reference cycle goes with the cyclic garbage
        gc.collect()
        time.sleep(0.05)
    assert after["children"] == [], f"worker processes left: {after['children']}"
    assert after["threads"] == [], f"worker threads left: {after['threads']}"
    assert after["segments"] == [], f"shared-memory segments left: {after['segments']}"
    assert after["fds"] <= before["fds"], f"file descriptors grew from {before['fds']} to {after['fds']}"


@pytest.fixture
def marker_dir(tmp_path):
    """A directory for one-shot fault markers; releases hung samples at teardown."""
    yield str(tmp_path)
    open(os.path.join(tmp_path, "release"), "w").close()
