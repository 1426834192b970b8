"""``superkernel.precompile_step``: a decode step compiled once ahead of time, called without Dynamo's guard tree.

See :mod:`superkernel.static_kernel.step` for what is checked per call and
docs/api.md ("Precompiled step") for what it assumes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from superkernel.config import CompilerConfig
from superkernel.static_kernel.frames import FrameUnsupported, GuardFilter, precompile
from superkernel.static_kernel.step import ON_VIOLATION, PrecompiledStep, PrecompiledStepError


def precompile_step(fn: Callable[..., Any], example_args: tuple[Any, ...],
                    compiler_config: CompilerConfig | None = None, *, on_violation: str = "fallback") -> PrecompiledStep:
    """Compile ``fn`` (a function or bound method, one graph) for ``example_args`` now, with the superkernel backend.

    Build it under the settings it will be called under (``torch.no_grad()``, thread count,
    default dtype): they are part of what the frame assumes. ``on_violation``: ``"fallback"``
    (a call the frame does not apply to runs ``torch.compile(fn)`` with the same backend) or
    ``"error"`` (it raises :class:`PrecompiledStepError`). Raises :class:`FrameUnsupported`
    when ``fn`` cannot be one precompiled frame (a graph break, a guard torch cannot keep,
    a torch without AOT precompile).
    """
    from superkernel.pipeline.backend import get_backend, register_compiled

    if on_violation not in ON_VIOLATION:
        raise ValueError(f"on_violation={on_violation!r}: allowed values are {', '.join(ON_VIOLATION)}")
    if isinstance(fn, torch.nn.Module):
        raise TypeError("precompile_step takes a function or bound method (e.g. a decode step closing over the "
                        "model), not a module: wrap the module call in a function")
    backend = get_backend(compiler_config)
    args = tuple(example_args)
    # quantized (tensor-subclass) weights cannot be guarded by a frame; the watch stands in for them
    guard_filter = GuardFilter(skip_subclass_weights=True)
    aot_fn = precompile(fn, backend, args, {}, guard_filter)

    def guarded() -> Callable[..., Any]:
        return torch.compile(fn, backend=backend, dynamic=False)

    step = PrecompiledStep(fn, aot_fn, guarded, on_violation=on_violation,
                           unguarded_subclass_guards=guard_filter.skipped)
    register_compiled(step, backend)
    return step


__all__ = ["FrameUnsupported", "PrecompiledStep", "PrecompiledStepError", "precompile_step"]
