"""``serialized``: run one non-reentrant third-party call in one thread at a time.

steadyfeed itself needs no locks around data: workers share nothing but read-only
sources. The one place a lock belongs is around a library call that is not safe to
enter from two threads at once (an old decoder with global state, a C library without
thread support). Wrap **that call, and nothing more**::

    decode = steadyfeed.serialized(legacy_codec.decode)     # the smallest critical section

    def transform(sample, rng):
        image = decode(sample["jpeg"])                        # one thread at a time in here
        return {"x": augment(image, rng), "y": sample["y"]}   # everything else stays parallel

Never wrap a whole transform or a source's ``__getitem__``: that turns thread workers
into one worker with extra steps. A call that holds the GIL anyway gains nothing from
threads; use ``mode="process"``, where each process has its own lock and runs in parallel.

Guarantees: at most one thread of a process runs the wrapped function at any moment;
the wrapper pickles without its lock (each process, including a fork, gets a fresh
one), so a source or transform holding it travels to process workers; with ``timeout``
a thread that cannot get its turn in time raises TimeoutError naming the function
instead of waiting forever behind a hung call.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, overload


class Serialized:
    """A callable that runs ``fn`` under a per-process lock. Made by :func:`serialized`."""

    def __init__(self, fn: Callable, timeout: float | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"serialized() needs a callable, got {type(fn).__name__}")
        self.fn, self.timeout = fn, timeout
        functools.update_wrapper(self, fn, updated=())  # name and doc, not the callable's attributes
        self._new_lock()

    def _new_lock(self) -> None:
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._pid != os.getpid():  # a forked child: the parent's lock may have been copied held
            self._new_lock()
        if not self._lock.acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise TimeoutError(f"{self._name()} stayed busy in another thread for more than {self.timeout} s")
        try:
            return self.fn(*args, **kwargs)
        finally:
            self._lock.release()

    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def __reduce__(self):
        # as a module-level decorator the wrapper *is* the module attribute: pickle it by
        # name like a function; otherwise by value, without the lock
        module = getattr(self, "__module__", None)
        qualname = getattr(self, "__qualname__", None)
        if module and qualname and _lookup(module, qualname) is self:
            return qualname
        return (Serialized, (self.fn, self.timeout))

    def __repr__(self) -> str:
        return f"serialized({self._name()})"


def _lookup(module: str, qualname: str) -> Any:
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


@overload
def serialized(fn: Callable, *, timeout: float | None = None) -> Serialized: ...
@overload
def serialized(fn: None = None, *, timeout: float | None = None) -> Callable[[Callable], Serialized]: ...
def serialized(
    fn: Callable | None = None, *, timeout: float | None = None
) -> Serialized | Callable[[Callable], Serialized]:
    """Wrap ``fn`` so that only one thread (per process) runs it at a time.

    Use as ``decode = serialized(lib.decode)``, ``serialized(lib.decode, timeout=30)``, or
    as a decorator (``@serialized`` / ``@serialized(timeout=30)``) on a module-level function.
    See the module docstring: wrap the smallest critical section, never a whole transform.
    """
    if fn is None:
        return functools.partial(Serialized, timeout=timeout)
    return Serialized(fn, timeout)
