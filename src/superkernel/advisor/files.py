"""Atomic output writes that never replace a file the user gave as input."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


class OutputError(ValueError):
    """An output path that would overwrite an input, or cannot be written."""


def check_not_input(path: Path, inputs: list[Path]) -> None:
    target = path.resolve()
    for item in inputs:
        if item is not None and Path(item).resolve() == target:
            raise OutputError(f"refusing to write {path}: it is an input of this run ({item}); choose another --output")


def atomic_write(path: Path, data: str | bytes, inputs: list[Path] = ()) -> Path:
    """Write to a temporary file in the same directory, then ``os.replace`` it into place."""
    path = Path(path)
    check_not_input(path, list(inputs))
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give outputs the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
