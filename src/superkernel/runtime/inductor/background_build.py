"""A partition's plain C++ is built by g++ in the background while its frozen variant is lowered.

CPU max-autotune with ``inductor.freezing = "auto"`` compiles a partition twice, plain then frozen
(:func:`superkernel.runtime.inductor.cpu_freezing.choose`). Inductor builds each compiled module with g++ before it
returns, so the plain variant's build (2-3 s for a Qwen2-0.5B-wide decoder layer) and the frozen variant's
lowering (Inductor's Python) ran one after the other on a machine with a second core idle.
:func:`builds_in_background` makes the C++ builds Inductor starts inside it run on a worker thread (g++ is a
subprocess: the thread only waits on it) and gives back one wait per build; the compiled function waits for
its build at its first call. :func:`choose` waits for all of them before it returns, so a build error still
surfaces where the compile does (and the partition falls back the same way).
"""

from __future__ import annotations

import contextlib
import threading
import unittest.mock
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="superkernel-cpp-build")
        return _POOL


@contextlib.contextmanager
def builds_in_background(enabled: bool = True) -> Iterator[list[Callable[[], Any]]]:
    """Inside: Inductor's C++ wrapper modules are built on a worker thread; yields the list of waits
    (each returns the loaded entry point or raises the build's error)."""
    pending: list[Callable[[], Any]] = []
    try:
        from torch._inductor.codecache import CppWrapperCodeCache
    except ImportError:
        enabled = False
    if not enabled or not hasattr(CppWrapperCodeCache, "load_pybinding_async"):
        yield pending
        return
    load_async = CppWrapperCodeCache.load_pybinding_async

    def load_pybinding(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        kwargs.setdefault("submit_fn", _pool().submit)
        entry = load_async(*args, **kwargs)
        pending.append(entry)

        def inductor_entry(*call_args: Any) -> Any:
            return entry()(*call_args)

        return inductor_entry

    with unittest.mock.patch.object(CppWrapperCodeCache, "load_pybinding", staticmethod(load_pybinding)):
        yield pending


def wait_all(pending: list[Callable[[], Any]]) -> None:
    """Wait for every build in ``pending``; the first error is raised."""
    for entry in pending:
        entry()
