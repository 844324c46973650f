"""``pack`` in a child process: how ``Loader(pack_to=...)`` builds its pack beside training.

A packer thread in the training process competes with the loader's threads and the training
loop for the GIL, and nice values do not reach the GIL: on 20,000 cold ``.npy`` pairs the
first epoch took 1.17x as long with a thread packing beside it, 0.90x with a process
(``benchmarks/bench_pack_to.py``; the child also warms the page cache for the loader).

Guarantees:

* the child is a fresh interpreter (``steadyfeed.pack_process`` run as ``__main__``), not a
  ``multiprocessing`` child: it never re-imports the training script, so a script without
  ``if __name__ == "__main__":`` is not run twice;
* it gets the source pickled through its stdin (our own bytes, from this process), imports
  from the parent's ``sys.path`` (as ``PYTHONPATH``), packs at ``niceness`` below the parent
  (it imports at ``START_NICENESS``, between the workers' priority and that),
  and answers one JSON line on its stdout. Its stdin stays open as a lifeline: the child exits as soon as it closes, when
  the parent is cancelled (``Packing.cancel``), exits or is killed. So no packer outlives
  its loader;
* what cannot run there says so instead of failing the pack: a source that does not pickle,
  or whose class the child cannot import (defined in ``__main__``), raises ``NotPortable``,
  and the caller packs in a thread instead. A failing sample raises ``PackFailed`` with the
  message ``pack`` gave in the child (the sample, its file and the error).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_LENGTH = struct.Struct("<Q")
# The child's imports (about 0.3 s of CPU, once) run this far below the parent: below its
# workers (worker_niceness, 5 by default), so they do not slow the first epoch they overlap,
# yet not so far that they starve on a busy machine (at nice 19 they took 30 s under
# stress-ng --cpu 2). The packing itself then runs at the niceness it is given.
START_NICENESS = 10
_START = f"import os, runpy, sys; os.nice(int(sys.argv[1])); runpy.run_module({__name__!r}, run_name='__main__', alter_sys=True)"
JOIN_SECONDS = 10.0


class NotPortable(Exception):
    """The source cannot be packed in a child process (it does not pickle or unpickle there)."""


class PackFailed(Exception):
    """The child's ``pack`` raised; the message is its error."""


class Cancelled(Exception):
    """``Packing.cancel`` ended the child before it finished."""


class Packing:
    """One child process packing ``source`` into ``out``; ``wait()`` returns once it is done."""

    def __init__(self, source: Any, out: str | os.PathLike[str], niceness: int):
        try:
            job = pickle.dumps((source, os.fspath(out), niceness))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise NotPortable(f"the source does not pickle ({exc})") from exc
        self._payload = _LENGTH.pack(len(job)) + job
        self._cancelled = threading.Event()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _START, str(START_NICENESS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},  # ours: where its modules are
            )
        except OSError as exc:  # no interpreter to start (an embedded Python), no fds, no memory
            raise NotPortable(f"cannot start {sys.executable} ({exc})") from exc

    def wait(self) -> None:
        """Send the source, wait for the child's answer; raise what it reported."""
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        try:
            try:
                stdin.write(self._payload)
                stdin.flush()  # stdin stays open: the lifeline
            except (OSError, ValueError):  # the child is gone already, or cancel() closed its stdin
                pass
            answer = stdout.read()  # one line, at the child's end; b"" when it ended without one
        finally:
            self._reap()
        if not answer and self._cancelled.is_set():
            raise Cancelled("the loader was closed")
        try:
            result = json.loads(answer)
        except ValueError:
            code = self._process.returncode
            raise PackFailed(f"the packer process ended with exit code {code} before it finished") from None
        if result.get("not_portable"):
            raise NotPortable(result["not_portable"])
        if result.get("error"):
            raise PackFailed(result["error"])

    def cancel(self) -> None:
        """Stop the child: its lifeline closes, and it exits at once (``wait`` then raises Cancelled)."""
        self._cancelled.set()
        self._close_lifeline()

    def _close_lifeline(self) -> None:
        try:
            if self._process.stdin is not None:
                self._process.stdin.close()
        except (OSError, ValueError):  # closed while wait() was writing to it
            pass

    def _reap(self) -> None:
        self._close_lifeline()
        try:
            self._process.wait(JOIN_SECONDS)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a hung disk): wait no more
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


# -- the child ------------------------------------------------------------------------------------
def _exit_when_orphaned(lifeline) -> None:
    """Block on stdin until it closes, then end the process, wherever the packing stands."""
    while lifeline.read(1 << 16):
        pass
    os._exit(0)


def _answer(out, **result) -> None:
    out.write(json.dumps(result).encode() + b"\n")
    out.flush()


def _frame(stream) -> bytes | None:
    header = stream.read(_LENGTH.size)
    return stream.read(_LENGTH.unpack(header)[0]) if len(header) == _LENGTH.size else None


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    job = _frame(stdin)
    if job is None:  # cancelled before it was sent
        return
    threading.Thread(target=_exit_when_orphaned, args=(stdin,), daemon=True).start()
    try:
        source, out, niceness = pickle.loads(job)
    except Exception as exc:  # a class defined in the parent's __main__, say
        _answer(stdout, not_portable=f"the source does not unpickle in a child process ({type(exc).__name__}: {exc})")
        return
    from .packing import pack

    # lowered the rest of the way only now (START_NICENESS): the packing takes idle cycles only
    os.nice(max(0, min(19, int(niceness)) - START_NICENESS))
    try:
        pack(source, Path(out), progress=False)
    except BaseException as exc:
        _answer(stdout, error=f"{type(exc).__name__}: {exc}")
        return
    _answer(stdout, error=None)


if __name__ == "__main__":
    main()
