"""Execution: carrying out batch tasks inline, on threads or on spawned processes."""

from .pool import make_pool
from .scheduler import EpochRun

__all__ = ["EpochRun", "make_pool"]
