"""Atomic file writes and the build-directory lock.

Every file is written to a temporary name in its final directory, flushed, fsynced and
renamed into place, so a reader (or a crash) never sees half a file. Building is
serialized per build directory by a file lock (the ``filelock`` package, an OS lock
that the kernel releases when its holder dies).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

LOCK_NAME = ".build.lock"


def atomic_write_bytes(path: Path | str, data: bytes, *, durable: bool = True) -> None:
    """Write via a temporary sibling + rename; ``durable`` also fsyncs (not needed for cache copies)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def temp_path_for(path: Path) -> Path:
    """A unique temporary sibling of ``path`` (same directory, so ``os.replace`` is atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_LOCKS: dict[str, Any] = {}
_LOCKS_GUARD = threading.Lock()


def build_lock(outputs_root: Path) -> Any:
    """The process-wide lock object of one build directory (re-entrant within this process)."""
    from filelock import FileLock

    outputs_root.mkdir(parents=True, exist_ok=True)
    path = str((outputs_root / LOCK_NAME).resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.get(path)
        if lock is None:
            lock = FileLock(path, thread_local=False) if _accepts_thread_local() else FileLock(path)
            _LOCKS[path] = lock
        return lock


def _accepts_thread_local() -> bool:
    import inspect

    from filelock import FileLock

    try:
        return "thread_local" in inspect.signature(FileLock.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
