"""Models for the workflow: the embedded zoo and local checkpoint loading.

Imported lazily: the command line's parser lists the zoo (``zoo``, no torch) without importing the
loader (torch, transformers).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"DEFAULT_MODEL": "zoo", "ZOO": "zoo", "ZooEntry": "zoo", "zoo_listing": "zoo",
            "LoadedModel": "loader", "ModelLoadError": "loader", "load_model": "loader", "looks_like_path": "loader"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
