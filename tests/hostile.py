"""Hostile machines for the tests: a small private /dev/shm, a small filesystem that fills up
(mount namespaces: ``unshare -m``, as root) and a low file-descriptor limit, each around a
child Python process so the test process keeps its own machine.

``run_python(code, ...)`` runs ``code`` in a fresh interpreter (``tests/`` on its path, for
``helpers``) and returns what it printed last as JSON: scripts report with
``print(json.dumps(...))`` and the test asserts on that.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _namespace_problem() -> str | None:
    """Why mount namespaces cannot be used here, or None when they can."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "needs Linux and unshare(1)"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"mount namespaces are not permitted here (unshare -m + mount: {probe.stderr.strip()[:200]})"
    return None


def need_namespaces() -> None:
    """Skip the calling test, saying why, where a private mount cannot be made."""
    problem = _namespace_problem()
    if problem is not None:
        pytest.skip(problem)


def _mounts(shm_size: str | None, small_fs: tuple[str, str] | None, read_only: str | None) -> list[str]:
    steps = []
    if shm_size is not None:
        steps.append(f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm")
    if small_fs is not None:
        path, size = small_fs
        steps.append(f"mount -t tmpfs -o size={size} tmpfs '{path}'")
    if read_only is not None:
        steps.append(f"mount --bind '{read_only}' '{read_only}' && mount -o remount,bind,ro '{read_only}'")
    return steps


def run_python(
    code: str,
    *,
    shm_size: str | None = None,
    small_fs: tuple[str, str] | None = None,
    read_only: str | None = None,
    nofile: int | None = None,
    timeout: float = 240,
) -> dict:
    """Run ``code`` in a child interpreter, in a mount namespace of its own when asked: a tmpfs
    of ``shm_size`` at /dev/shm, a tmpfs of ``small_fs[1]`` at ``small_fs[0]``, ``read_only``
    bind-mounted read-only; ``nofile``: its RLIMIT_NOFILE (soft and hard). Returns the JSON of
    its last line of output; fails the test with its output when it exits non-zero."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    steps = _mounts(shm_size, small_fs, read_only)
    if steps:
        need_namespaces()
        argv = ["unshare", "-m", "sh", "-c", " && ".join(steps) + ' && exec "$@"', "sh", *argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}

    def limit():
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=limit)
    output = done.stdout.strip().splitlines()
    assert done.returncode == 0 and output, (
        f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )
    return json.loads(output[-1])
