"""When capturing a data-dependent value makes Dynamo fail, trace that frame again without capturing.

A superkernel compile traces with ``capture_scalar_outputs`` and
``capture_dynamic_output_shape_ops`` (``tracing.CAPTURE_SETTINGS``): ``.item()`` and
``nonzero`` become graph values instead of graph breaks, so scopes around them survive.
Some code cannot be traced that way: MPT's attention slices its position bias with an
index computed from a tensor (``past_key_values.get_seq_length()``), and the unbacked
size of the slice makes Dynamo raise (``PendingUnbackedSymbolNotFound``,
``GuardOnDataDependentSymNode``) where plain ``torch.compile`` takes a graph break.

This module wraps Dynamo's per-frame converter (``ConvertFrame.__call__``, a row of
``runtime.inductor.tweaks.TWEAKS``) while a superkernel-compiled object runs or the decode
harness allows it (:func:`enter` / :func:`leave`; torch's own is back afterwards, so another
torch.compile in the process sees Dynamo unchanged): when converting a frame under a
superkernel compile fails with such a data-dependent error while the capture settings are
on, the same frame is converted once more with them off (nothing of the frame has run:
Dynamo converts a frame before executing it), so it graph-breaks like plain
``torch.compile`` does. A :class:`SuperKernelCaptureFallbackWarning` names the error and
the source line; ``strict-scope-check=abort`` on a scope of the compiled model raises
:class:`~superkernel.ir.graph.SuperKernelScopeError` instead. ``backend="superkernel"`` by name
has no context around its calls (only around its compiles, from the compile-start callback,
which runs inside the converter): there the error is Dynamo's.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import warnings
from typing import Any, Callable, Iterator

import torch

from superkernel.pipeline.backend_context import superkernel_context_of

#: Names of the errors a captured data-dependent value causes (anywhere in the exception chain,
#: or as the prefix Dynamo gives an internal error it re-wraps).
DATA_DEPENDENT_ERRORS = ("GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound",
                         "DataDependentOutputException", "DynamicOutputShapeException")


class SuperKernelCaptureFallbackWarning(UserWarning):
    """A frame could not be traced with data-dependent values captured; it was traced with graph breaks."""


class _State(threading.local):
    def __init__(self) -> None:
        self.disabled = False  # True while a frame is converted again without the capture settings
        self.harness = 0       # > 0 inside allowed(): every compile may fall back, whatever its backend


state = _State()
_warned: set[str] = set()  # sources warned about outside a superkernel backend (once per process)


@contextlib.contextmanager
def allowed() -> Iterator[None]:
    """Let every compile inside fall back, not only superkernel's: the decode harness turns the
    captures on for its baselines too (plain torch.compile, ``torch._dynamo.explain``), so they
    must fall back the same way, as plain torch.compile without the captures would graph-break."""
    state.harness += 1
    try:
        with converter_wrapped():
            yield
    finally:
        state.harness -= 1


def is_data_dependent_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if name in DATA_DEPENDENT_ERRORS or any(str(current).startswith(f"{n}:") for n in DATA_DEPENDENT_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.+)')


def describe(exc: BaseException) -> tuple[str, str]:
    """(error in one line, ``file:line: source`` of the innermost user frame Dynamo reports)."""
    text = str(exc)
    error = " ".join(text.split("\n", 1)[0].split())[:200]
    frames = _USER_FRAME.findall(text.split("from user code:", 1)[-1]) if "from user code:" in text else []
    if frames:
        path, line, source = frames[-1]
        return error, f"{path}:{line}: {source.strip()[:160]}"
    return error, "(source line not reported by Dynamo)"


_hooks: list[Callable[..., Any]] = []  # [active_backend, scope_of_break], given by pipeline.tracing (see use)


def use(active_backend: Callable[[], Any], scope_of_break: Callable[[str], tuple[str, str] | None]) -> None:
    """``active_backend()``: the superkernel backend whose call runs on this thread, or None (only its compiles
    fall back); ``scope_of_break(text)``: (label, options) of the scope a Dynamo message points into. Both from
    ``pipeline.tracing``, which imports this module (passed in to keep imports one-way)."""
    _hooks[:] = [active_backend, scope_of_break]


def _wrapping(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ConvertFrame.__call__`` that converts a frame once more without the capture settings when converting it
    under a superkernel call (or :func:`allowed`) failed with a data-dependent error; for any other frame (another
    thread's, another backend's: vLLM's) it is ``original`` plus one call."""

    @functools.wraps(original)
    def __call__(self, frame, cache_entry, hooks, frame_state, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        try:
            return original(self, frame, cache_entry, hooks, frame_state, *args, **kwargs)
        except Exception as exc:
            active_backend, scope_of_break = _hooks or (lambda: None, lambda text: None)
            backend = active_backend()
            if backend is not None and superkernel_context_of(self) is None:
                backend = None  # another backend's converter, running inside a superkernel call: not ours
            if (backend is None and not state.harness) or state.disabled or not is_data_dependent_error(exc):
                raise
            _fall_back(backend, exc, scope_of_break(str(exc)))
            state.disabled = True
            try:
                with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
                    return original(self, frame, cache_entry, hooks, frame_state, *args, **kwargs)
            finally:
                state.disabled = False

    __call__._superkernel_fallback = True  # type: ignore[attr-defined]
    return __call__


_lock = threading.Lock()
_depth = 0
_made: tuple[Any, Any, Any] | None = None     # (ConvertFrame, torch's __call__, our wrapper), made once
_installed: tuple[Any, Any, Any] | None = None  # the same while our wrapper is in place


def _install() -> tuple[Any, Any, Any] | None:
    """Put our wrapper in place of torch's ``ConvertFrame.__call__`` (made once, per torch function wrapped)."""
    global _made
    if _made is not None:
        cls = _made[0]
    else:
        try:
            from torch._dynamo.convert_frame import ConvertFrame as cls
        except ImportError:  # pragma: no cover - other torch versions (tests/backend/test_tweaks.py)
            return None
    current = cls.__dict__.get("__call__")
    if current is None or getattr(current, "_superkernel_fallback", False):
        return None  # no converter, or wrapped already (not by this entry: left as it is)
    if _made is None or _made[1] is not current:
        _made = (cls, current, _wrapping(current))
    cls.__call__ = _made[2]
    return _made


def enter() -> None:
    """Wrap Dynamo's frame converter (see the module doc) until the matching :func:`leave`; nested and
    concurrent entries share one wrapping. Entered around every call of a superkernel-compiled object:
    Dynamo converts a frame lazily, while the compiled object runs (its first call, a recompile, the
    frame after a graph break), not in ``torch.compile``. A no-op when this torch has no ``ConvertFrame``."""
    global _depth, _installed
    with _lock:
        _depth += 1
        if _depth == 1:
            _installed = _install()


def leave() -> None:
    """Undo :func:`enter`: the last leave puts torch's own ``ConvertFrame.__call__`` back (unless someone
    replaced ours meanwhile: theirs stays)."""
    global _depth, _installed
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0 and _installed is not None:
            cls, original, wrapper = _installed
            _installed = None
            if cls.__dict__.get("__call__") is wrapper:
                cls.__call__ = original


@contextlib.contextmanager
def converter_wrapped() -> Iterator[None]:
    """:func:`enter` ... :func:`leave` as a context manager (the entry of this tweak in ``TWEAKS``)."""
    enter()
    try:
        yield
    finally:
        leave()


def _fall_back(backend: Any, exc: BaseException, scope: tuple[str, str] | None) -> None:
    """Warn (or, under strict-scope-check=abort, raise) and record the fallback as a cut of its scope."""
    from superkernel.ir.graph import Cut, SuperKernelScopeError, parse_options

    error, where = describe(exc)
    message = (f"capturing a data-dependent value made Dynamo fail at {where} ({error}); the frame is traced "
               "again without capture_scalar_outputs / capture_dynamic_output_shape_ops, so it graph-breaks "
               "there as plain torch.compile does")
    if scope is None or backend is None:
        warned = _warned if backend is None else backend.__dict__.setdefault("_capture_fallbacks_warned", set())
        if where not in warned:  # once per source line and backend: the frame may be converted again
            warned.add(where)
            warnings.warn(f"superkernel: {message}", SuperKernelCaptureFallbackWarning, stacklevel=3)
        return
    label, options = scope
    cut = Cut(scope=label, node_index=-1, op="capture fallback", reason=message[:400],
              source=where.split(": ", 1)[0])
    try:
        strict = parse_options(options).strict_scope_check == "abort"
    except Exception:  # noqa: BLE001 - malformed options are reported where the scope is cut
        strict = False
    if strict:
        raise SuperKernelScopeError(f"strict-scope-check=abort: {cut.describe()}", cut) from exc
    if not any(c.source == cut.source and c.scope == cut.scope for c in backend.scope_breaks):
        backend.scope_breaks.append(cut)
        warnings.warn(f"superkernel: {cut.describe()}", SuperKernelCaptureFallbackWarning, stacklevel=3)
