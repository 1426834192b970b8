"""The build-directory lock (files themselves are written with superkernel.util).

Building is serialized per build directory by a file lock (the ``filelock`` package, an OS lock
that the kernel releases when its holder dies).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

LOCK_NAME = ".build.lock"


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
