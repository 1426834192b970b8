"""When capturing a data-dependent value makes Dynamo fail, trace that frame again without capturing.

A superkernel compile traces with ``capture_scalar_outputs`` and
``capture_dynamic_output_shape_ops`` (``tracing.CAPTURE_SETTINGS``): ``.item()`` and
``nonzero`` become graph values instead of graph breaks, so scopes around them survive.
Some code cannot be traced that way: MPT's attention slices its position bias with an
index computed from a tensor (``past_key_values.get_seq_length()``), and the unbacked
size of the slice makes Dynamo raise (``PendingUnbackedSymbolNotFound``,
``GuardOnDataDependentSymNode``) where plain ``torch.compile`` takes a graph break.

This module wraps Dynamo's per-frame converter: when converting a frame under a
superkernel compile fails with such a data-dependent error while the capture settings are
on, the same frame is converted once more with them off (nothing of the frame has run:
Dynamo converts a frame before executing it), so it graph-breaks like plain
``torch.compile`` does. A :class:`SuperKernelCaptureFallbackWarning` names the error and
the source line; ``strict-scope-check=abort`` on a scope of the compiled model raises
:class:`~superkernel.pipeline.ir.SuperKernelScopeError` instead.
"""

from __future__ import annotations

import functools
import re
import threading
import warnings
from typing import Any

import torch

#: Names of the errors a captured data-dependent value causes (anywhere in the exception chain,
#: or as the prefix Dynamo gives an internal error it re-wraps).
DATA_DEPENDENT_ERRORS = ("GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound",
                         "DataDependentOutputException", "DynamicOutputShapeException")


class SuperKernelCaptureFallbackWarning(UserWarning):
    """A frame could not be traced with data-dependent values captured; it was traced with graph breaks."""


class _State(threading.local):
    def __init__(self) -> None:
        self.disabled = False  # True while a frame is converted again without the capture settings


state = _State()


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


def install() -> None:
    """Wrap Dynamo's frame converter once (see module doc); a no-op when this torch has none."""
    try:
        from torch._dynamo.convert_frame import ConvertFrame
    except ImportError:  # pragma: no cover - other torch versions
        return
    original = ConvertFrame.__call__
    if getattr(original, "_superkernel_fallback", False):
        return

    @functools.wraps(original)
    def __call__(self, frame, cache_entry, hooks, frame_state, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        from superkernel.pipeline.tracing import active_backend

        try:
            return original(self, frame, cache_entry, hooks, frame_state, *args, **kwargs)
        except Exception as exc:
            backend = active_backend()
            if backend is None or state.disabled or not is_data_dependent_error(exc):
                raise
            _fall_back(backend, exc)
            state.disabled = True
            try:
                return original(self, frame, cache_entry, hooks, frame_state, *args, **kwargs)
            finally:
                state.disabled = False

    __call__._superkernel_fallback = True  # type: ignore[attr-defined]
    ConvertFrame.__call__ = __call__


def _fall_back(backend: Any, exc: BaseException) -> None:
    """Warn (or, under strict-scope-check=abort, raise) and record the fallback as a cut of its scope."""
    from superkernel.pipeline.ir import Cut, SuperKernelScopeError, parse_options
    from superkernel.pipeline.tracing import scope_of_break

    error, where = describe(exc)
    message = (f"capturing a data-dependent value made Dynamo fail at {where} ({error}); the frame is traced "
               "again without capture_scalar_outputs / capture_dynamic_output_shape_ops, so it graph-breaks "
               "there as plain torch.compile does")
    scope = scope_of_break(str(exc))
    if scope is None:
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
