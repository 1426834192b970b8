"""One way for fixtures to set environment variables for a block (children inherit them)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``os.environ.update(values)`` for the block, then every variable restored (or removed)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
