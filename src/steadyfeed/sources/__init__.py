"""Sources: random-access datasets. See ``base.py`` for the protocol."""
from .array import ArraySource
from .base import Source
from .npy import NpyArray, NpyPairs, read_npy

__all__ = ["ArraySource", "NpyArray", "NpyPairs", "Source", "read_npy"]
