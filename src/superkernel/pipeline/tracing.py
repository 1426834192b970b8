"""How a superkernel compile makes Dynamo trace: the settings it applies around every call
of a compiled object, and what it learns from Dynamo's graph-break log.

The backend itself (``pipeline.backend``) decides what to do with a graph break inside a
scope; this module only sets Dynamo up and reads what Dynamo says.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from typing import Any

import torch

from superkernel import eager_branch
from superkernel.pipeline import backend_context, capture_fallback

# --- Dynamo settings under which a superkernel compile traces ----------------------------
#
# A data-dependent op (nonzero, boolean masking) or a host sync (.item()) inside a scope
# makes Dynamo graph-break inside ``torch.fx.traceback.annotate``, which it cannot resume:
# the whole frame would run eagerly and the scope vanish. With these two settings Dynamo
# captures those ops instead, and the segmentation cuts the scope around them.
# The backend's ``dynamo.dynamic_sources`` (config.py; by default the growing position int of
# transformers' sliding-window caches) are added to torch.compiler.config.dynamic_sources,
# so a decode loop compiles once instead of once per position.
# Dynamo enters ``backend_ctx_ctor`` around every call of an object compiled with a backend
# object (torch.compile(backend=get_backend(cfg)), superkernel.compile; how it gets there:
# ``pipeline.backend_context``), so tracing and recompiles see the settings; a compile for
# backend="superkernel" by name, which Dynamo calls without it, enters the same context from
# the compile-start callback for that compile alone. Already-set flags (the decode harness, a
# user's global setting) cost a few attribute reads per call.
CAPTURE_SETTINGS = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}


class SuperKernelScopeBreakWarning(UserWarning):
    """Dynamo graph-broke inside a superkernel scope: the scope's operators run uncompiled."""


class _BreakLog(logging.Handler):
    """Keeps Dynamo's graph-break log records (file:line, reason, the ``with`` line of the scope)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append(record.getMessage())
            del self.records[:-64]
        except Exception:  # pragma: no cover - logging must never break compilation
            pass


_break_log: _BreakLog | None = None


def install_break_log() -> _BreakLog | None:
    """Listen to Dynamo's graph-break artifact log (without printing it unless the user asked)."""
    global _break_log
    try:
        from torch._dynamo.symbolic_convert import graph_break_log
    except ImportError:  # pragma: no cover - other torch versions
        return None
    if _break_log is None:
        _break_log = _BreakLog()
    try:  # Dynamo logs each (kind, place) of graph break once per process; this backend needs its own
        from torch._dynamo.utils import graph_break_dup_warning_checker

        graph_break_dup_warning_checker.reset()
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    if _break_log not in graph_break_log.handlers:
        graph_break_log.addHandler(_break_log)
    if not graph_break_log.isEnabledFor(logging.DEBUG):  # the user did not ask for graph-break logs
        graph_break_log.setLevel(logging.DEBUG)
        graph_break_log.propagate = False
    return _break_log


_SCOPE_CALL = re.compile(r"super(?:kernel_scope|_kernel)\(([^)]*)")
_LITERAL = re.compile(r"[\"']([^\"']*)[\"']")
BREAK_AT = re.compile(r"Graph break in user code at (\S+:\d+)")


def _scope_literals(line: str) -> tuple[str, str] | None:
    """(label, options) of a ``with super_kernel("label", "options")`` line written with literals, else None."""
    if "with " in line and ("super_kernel(" in line or "superkernel_scope(" in line):
        found = _SCOPE_CALL.search(line)
        literals = _LITERAL.findall(found.group(1)) if found else []
        if literals:
            return literals[0], literals[1] if len(literals) > 1 else ""
    return None


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _enclosing_scope_in_source(message: str, look_back: int = 200) -> tuple[str, str] | None:
    """The ``with super_kernel(...)`` line around the break's own source line, read from the file.

    torch 2.11's record of a break inside ``annotate`` ("Dynamo doesn't support graph break on
    torch.fx.traceback.annotate") lists the user frames down to the breaking line but not the ``with``
    line (torch 2.13's does); the innermost frame's file is read (``linecache``, as a traceback does) up
    to ``look_back`` lines above the break for the nearest ``with`` of a scope indented less than it."""
    import linecache

    frames = _USER_FRAME.findall(message)
    if not frames:
        return None
    path, lineno = frames[-1][0], int(frames[-1][1])
    broke = linecache.getline(path, lineno)
    if not broke.strip():
        return None
    indent = len(broke) - len(broke.lstrip())
    for number in range(lineno - 1, max(0, lineno - look_back), -1):
        line = linecache.getline(path, number)
        if not line.strip():
            continue
        level = len(line) - len(line.lstrip())
        if level < indent:
            found = _scope_literals(line)
            if found is not None:
                return found
            if line.lstrip().startswith(("def ", "async def ", "class ")):
                return None  # left the function without meeting a scope
            indent = level
    return None


def scope_of_break(message: str) -> tuple[str, str] | None:
    """(scope label, options) a graph-break record happened in, or None when outside every scope."""
    from superkernel.scope_apply import applied_scopes_in

    inside = any(mark in message for mark in ("annotate", "super_kernel(", "superkernel_scope(", "scoped_forward"))
    if not inside:
        return None
    for line in message.splitlines():
        found = _scope_literals(line)
        if found is not None:
            return found
    applied = applied_scopes_in(message)  # scopes put on modules with apply_scopes
    if applied:
        return applied[0]
    return _enclosing_scope_in_source(message) or ("?", "")


_dynamo_counters: Any = None  # torch._dynamo.utils.counters, looked up once


def _break_count() -> int:
    global _dynamo_counters
    if _dynamo_counters is None:
        from torch._dynamo.utils import counters

        _dynamo_counters = counters
    breaks = _dynamo_counters.get("graph_break")
    return sum(breaks.values()) if breaks else 0


class _Active(threading.local):
    """The superkernel calls running on this thread, innermost last (see CaptureContext)."""

    def __init__(self) -> None:
        self.stack: list["CaptureContext"] = []


_active = _Active()


class CaptureContext:
    """What Dynamo enters around each call of a compiled object.

    The settings (CAPTURE_SETTINGS and the backend's ``dynamo.dynamic_sources``) only matter
    while Dynamo traces, which a warm call never does; setting and restoring torch's config
    around every call cost ~70 us per decode step. So a call only marks itself active
    (a list append) and wraps Dynamo's frame converter while it runs (``capture_fallback.enter``:
    Dynamo converts frames lazily, inside the call; torch's own is back at the exit), and
    Dynamo's compile-start callback applies the settings of the innermost active call for
    exactly the duration of a compile (:func:`_on_compile_start`).
    """

    __slots__ = ("backend", "saved", "saved_sources", "breaks", "log_mark", "branch")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.saved: dict[str, Any] = {}
        self.saved_sources: str | None = None
        self.branch: Any = None

    def __enter__(self) -> None:
        _install_compile_callbacks()
        self.breaks = _break_count()
        self.log_mark = len(_break_log.records) if _break_log is not None else 0
        _active.stack.append(self)
        capture_fallback.enter()  # Dynamo converts this call's frames lazily, inside the call

    def __exit__(self, *exc: Any) -> None:
        capture_fallback.leave()
        stack = _active.stack
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:  # pragma: no cover - exits out of order
            stack.remove(self)
        self.restore()
        if _break_count() != self.breaks and _break_log is not None:
            records = _break_log.records[self.log_mark:] if self.log_mark <= len(_break_log.records) else []
            self.backend._scope_breaks(records)

    def apply(self) -> None:
        """Put this call's Dynamo settings in place (for one compile; :meth:`restore` undoes it)."""
        cfg = torch._dynamo.config
        for key, value in _capture_settings().items():
            if getattr(cfg, key) != value:
                self.saved.setdefault(key, getattr(cfg, key))
                setattr(cfg, key, value)
        if self.branch is None:
            self.branch = eager_branch.tracing_for(self.backend.config)
        sources = torch.compiler.config.dynamic_sources
        present = sources.split(",") if sources else []
        missing = [s for s in self.backend.config.dynamo.dynamic_sources if s not in present]
        if missing:
            if self.saved_sources is None:
                self.saved_sources = sources
            torch.compiler.config.dynamic_sources = ",".join([*present, *missing])

    def restore(self) -> None:
        if self.branch is not None:
            eager_branch.done(self.branch)
            self.branch = None
        cfg = torch._dynamo.config
        for key, value in self.saved.items():
            setattr(cfg, key, value)
        self.saved = {}
        if self.saved_sources is not None:
            torch.compiler.config.dynamic_sources = self.saved_sources
            self.saved_sources = None


def _capture_settings() -> dict[str, bool]:
    """CAPTURE_SETTINGS, or all off while a frame is traced again after a data-dependent failure
    (``pipeline.capture_fallback``), whoever turned them on."""
    return dict.fromkeys(CAPTURE_SETTINGS, False) if capture_fallback.state.disabled else CAPTURE_SETTINGS


def active_backend() -> Any:
    """The backend of the innermost superkernel call running on this thread, or None."""
    return _active.stack[-1].backend if _active.stack else None


# The call whose settings the running compile uses. Dynamo runs the start callbacks only for
# the outermost of nested compiles, and the end callbacks when it finishes: one at a time.
_applied: CaptureContext | None = None
# The context entered at compile start for a compile of a superkernel backend no call context covers
# (backend="superkernel" by name: Dynamo has no context to enter around the call), exited at compile end.
_adopted: CaptureContext | None = None


def _on_compile_start(_args: Any = None) -> None:
    """Apply the settings of the innermost superkernel call, or of the superkernel backend this compile is for;
    nothing for any other compile (another backend's, vLLM's)."""
    global _applied, _adopted
    found, make = backend_context.context_of_this_compile()
    if found and make is None:
        return  # another backend's compile, even one inside a superkernel call: torch's settings
    if _active.stack:
        _applied = _active.stack[-1]
    elif make is not None:
        _adopted = _applied = make()
        _adopted.__enter__()
    else:
        return
    _applied.apply()


def _on_compile_end(_args: Any = None) -> None:
    global _applied, _adopted
    if _applied is not None:
        _applied.restore()
        _applied = None
    if _adopted is not None:
        adopted, _adopted = _adopted, None
        try:  # reports this compile's graph breaks inside scopes
            adopted.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - an end callback that raises stops Dynamo's callbacks for good
            warnings.warn(f"superkernel: {exc}", SuperKernelScopeBreakWarning, stacklevel=2)


def _install_compile_callbacks() -> None:
    """Register the compile start/end callbacks with Dynamo (again after ``torch._dynamo.reset()``,
    which clears them); a membership test of a short list per call."""
    eager_branch.install()
    register_compile_callbacks()


def register_compile_callbacks() -> None:
    """The compile start/end callbacks, registered with Dynamo's public callback list (no torch name
    replaced); for a compile that is not superkernel's they do nothing (see :func:`_on_compile_start`)."""
    handler = torch._dynamo.callback_handler
    if _on_compile_start in handler.start_callbacks:
        return
    handler.register_start_callback(_on_compile_start)
    if _on_compile_end not in handler.end_callbacks:
        handler.register_end_callback(_on_compile_end)

GRAPH_BREAK_IN_SCOPE = "graph break inside the scope (Dynamo could not capture it; its operators run uncompiled)"


capture_fallback.use(active_backend, scope_of_break)
