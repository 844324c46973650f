"""The optional packages TFRecord support needs (protobuf, google-crc32c), imported on first
use so that ``import steadyfeed`` needs numpy alone."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, package: str) -> ModuleType:
    """``module``, imported; ImportError naming the pip ``package`` to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"TFRecord support needs the {package} package: pip install 'steadyfeed[tfrecord]'") from exc
