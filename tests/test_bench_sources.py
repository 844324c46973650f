"""``benchmarks/bench_sources.py``'s harness: a process forked from a run (a peer's pool worker)
ends on SIGTERM as in any program, so that its pool's ``terminate()`` cannot wait on it."""

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork: POSIX"),
]

# in a fresh interpreter: the handler is the run's, and at-fork hooks cannot be taken back
FORKED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import bench_sources
bench_sources.exit_on_sigterm()
ours = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, b"default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else b"inherited")
    os._exit(0)
os.waitpid(pid, 0)
print("ours" if ours else "none", os.read(read, 64).decode())
"""


def test_a_process_forked_from_a_run_gets_the_default_sigterm_back():
    out = subprocess.run(
        [sys.executable, "-c", FORKED, BENCHMARKS], capture_output=True, text=True, timeout=100, check=True
    )
    assert out.stdout.split() == ["ours", "default"]
