"""Sources: random-access datasets. See ``base.py`` for the protocol."""
from .array import ArraySource
from .base import Source

__all__ = ["ArraySource", "Source"]
