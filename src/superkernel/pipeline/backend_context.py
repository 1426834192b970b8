"""How Dynamo comes to enter a superkernel backend's context, without replacing anything of torch.

``backend_ctx_ctor`` is Dynamo's one documented hook for a context around every call of a compiled object
(``torch._dynamo.eval_frame._optimize`` reads it; ``pipeline.tracing.CaptureContext`` is ours). ``torch.compile``
does not hand Dynamo the backend: it wraps any non-Inductor backend in ``torch._TorchCompileWrapper``, whose
``__init__`` keeps only ``compiler_fn`` and ``kwargs``, so Dynamo finds no context on it (torch 2.11 and 2.13).
superkernel used to replace that ``__init__`` for the whole process; a serving engine (vLLM) compiling in the
same process must see torch unchanged, so instead (both rows of ``runtime.inductor.tweaks.TWEAKS``):

* a backend object answers the ``__name__`` read that ``_TorchCompileWrapper.__init__`` makes of it
  (:class:`BackendName`) and, when the reader is that ``__init__`` (its code object, compared by identity),
  puts its context on the one wrapper being built around it (:func:`hand_context_to_wrapper`; Dynamo's
  ``WrapBackendDebug`` copies the wrapper's attributes, where ``_optimize`` reads it);
* ``backend="superkernel"`` by name calls nothing of ours before Dynamo traces, so the compile-start callback
  (``pipeline.tracing``) asks :func:`context_of_this_compile`: the backend Dynamo's ``_compile`` frame
  compiles for (its ``compiler_fn`` argument), when it is superkernel's.

The same answer keeps superkernel out of another backend's compile that starts inside a superkernel call (a
function vLLM compiled itself, called from an eager part of our step): it traces with torch's settings.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

WRAPPER_INIT = "torch:_TorchCompileWrapper.__init__"
COMPILE_FRAME = "torch._dynamo.convert_frame:_compile"
_MARK = "_superkernel_context"


def mark(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make`` (a backend's ``backend_ctx_ctor``), marked as superkernel's."""
    setattr(make, _MARK, True)
    return make


def is_superkernel_context(make: Any) -> bool:
    return bool(getattr(make, _MARK, False))


def _wrapper_init_code() -> Any:
    import torch

    return getattr(getattr(getattr(torch, "_TorchCompileWrapper", None), "__init__", None), "__code__", None)


class BackendName:
    """A superkernel backend's ``__name__``; read by ``_TorchCompileWrapper.__init__``, it also hands the
    backend's context to that wrapper (see the module doc)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, backend: Any, owner: Any = None) -> str:
        if backend is not None:
            caller = sys._getframe(1)
            if caller.f_code is _wrapper_init_code():
                hand_context_to_wrapper(caller.f_locals.get("self"), backend)
        return self.name


def hand_context_to_wrapper(wrapper: Any, backend: Any) -> None:
    """Give ``wrapper`` (the ``_TorchCompileWrapper`` being built around ``backend``) the backend's context."""
    make = getattr(backend, "backend_ctx_ctor", None)
    if wrapper is not None and is_superkernel_context(make) and "backend_ctx_ctor" not in vars(wrapper):
        wrapper.backend_ctx_ctor = make


def superkernel_context_of(fn: Any, steps: int = 8) -> Callable[[], Any] | None:
    """The context of the superkernel backend behind ``fn`` (a backend, Dynamo's wrappers of one, a frame
    converter: followed through ``_torchdynamo_orig_backend`` and ``compiler_fn``), else None."""
    for _ in range(steps):
        if fn is None:
            return None
        make = getattr(fn, "backend_ctx_ctor", None)
        if is_superkernel_context(make):
            return make
        fn = getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
    return None


def context_of_this_compile(depth: int = 24) -> tuple[bool, Callable[[], Any] | None]:
    """(whether Dynamo's ``_compile`` frame is on the stack, the context of the superkernel backend it compiles
    for or None): the compile starting now, read from that frame's ``compiler_fn``. Never raises (a
    compile-start callback must not); (False, None) where the frame is not found."""
    try:
        frame = sys._getframe(1)
        for _ in range(depth):
            if frame is None:
                break
            if frame.f_code.co_name == "_compile" and frame.f_code.co_filename.endswith("convert_frame.py"):
                return True, superkernel_context_of(frame.f_locals.get("compiler_fn"))
            frame = frame.f_back
    except Exception:  # pragma: no cover - a torch whose frames differ: treated as not found
        pass
    return False, None


__all__ = ["BackendName", "COMPILE_FRAME", "WRAPPER_INIT", "context_of_this_compile", "hand_context_to_wrapper",
           "is_superkernel_context", "mark", "superkernel_context_of"]
