"""The build lock: one process per build directory builds, the others wait for its package.

An OS file lock (the ``filelock`` package) on ``static_kernel_outputs/.build.lock``: the
kernel releases it when its holder dies, so a killed builder leaves no stale lock.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from superkernel.static_kernel.settings import ENV_LOCK_TIMEOUT, StaticKernelWarning
from superkernel.util import make_dirs

LOCK_NAME = ".build.lock"

_LOCKS: dict[str, Any] = {}
_LOCKS_GUARD = threading.Lock()


def build_lock(outputs_root: Path) -> Any:
    """The process-wide ``FileLock`` of one build directory (re-entrant within this process)."""
    from filelock import FileLock

    make_dirs(outputs_root, "static kernel outputs folder")  # never through a link (docs/security.md)
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


class BuildLock:
    """This process's hold on one build directory's lock (``holding`` while it builds)."""

    def __init__(self, outputs_root: Path, counters: Counter[str]) -> None:
        self.root = outputs_root
        self.counters = counters
        self.lock = build_lock(outputs_root)
        self.holding = False

    def acquire(self) -> bool:
        """Take the lock, waiting (with one line on stderr) while another process builds; False on timeout."""
        if self.holding:
            return True
        timeout = float(os.environ.get(ENV_LOCK_TIMEOUT, "3600"))
        try:
            self.lock.acquire(timeout=0.05)
        except Exception:  # noqa: BLE001 - filelock.Timeout: someone else is building
            world = os.environ.get("LOCAL_WORLD_SIZE")
            rank = os.environ.get("LOCAL_RANK")
            who = f" (LOCAL_RANK {rank} of LOCAL_WORLD_SIZE {world})" if world else ""
            print(f"superkernel static kernels: another process is building in {self.root}; waiting{who}",
                  file=sys.stderr, flush=True)
            start = time.monotonic()
            try:
                self.lock.acquire(timeout=timeout)
            except Exception:  # noqa: BLE001
                warnings.warn(f"superkernel static kernels: gave up waiting {timeout:.0f}s for the build lock "
                              f"{self.lock.lock_file}; compiling without static kernels", StaticKernelWarning,
                              stacklevel=5)
                return False
            self.counters["waited_for_lock"] += 1
            self.counters["lock_wait_ms"] += int((time.monotonic() - start) * 1000)
        self.holding = True
        return True

    def release(self) -> None:
        if self.holding:
            self.holding = False
            try:
                self.lock.release()
            except Exception:  # noqa: BLE001 - already released by the OS
                pass
