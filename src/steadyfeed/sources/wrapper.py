"""SourceWrapper: the base of every source that wraps another (caches, ``Checked``).

A wrapper is a source itself. What it does not change goes to the wrapped source, and
the optional parts of the protocol (``base.py``) exist on the wrapper exactly when they
exist on the wrapped source, so the engine's helpers (``locate``, ``fingerprint``,
``read_many``) see the same answer through any stack of wrappers:

* ``len`` and ``close`` go to the wrapped source;
* ``locate`` and ``fingerprint`` are the wrapped source's own (absent when it has none);
* ``read_many`` is the wrapped source's, each sample passed through :meth:`wrap_sample`
  (absent when the wrapped source has none);
* ``wrapper[i]`` is ``wrap_sample(i, source[i])``.

A subclass overrides :meth:`wrap_sample`, or ``__getitem__`` / ``read_many`` themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import check_source, close_source


class SourceWrapper:
    def __init__(self, source: Any) -> None:
        check_source(source)
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Mapping[str, Any]:
        return self.wrap_sample(i, self.source[i])

    def wrap_sample(self, i: int, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        """What this wrapper makes of sample ``i`` as the wrapped source returned it."""
        return sample

    # Properties, so that each exists on the wrapper exactly when it exists on the source:
    # a missing one raises AttributeError, and getattr(wrapper, name, None) gives None.
    @property
    def read_many(self) -> Callable[[Any], Sequence[Mapping[str, Any]]]:
        inner = self.source.read_many
        return lambda ids: [self.wrap_sample(int(i), sample) for i, sample in zip(ids, inner(ids))]

    @property
    def locate(self) -> Callable[[int], str]:
        return self.source.locate

    @property
    def fingerprint(self) -> Callable[[], str]:
        return self.source.fingerprint

    def close(self) -> None:
        close_source(self.source)

    def _repr_options(self) -> str:
        """``", option=value"`` for the repr; nothing by default."""
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}{self._repr_options()})"
