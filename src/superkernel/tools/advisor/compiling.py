"""Compile one decode step for a plan, a reference or a baseline, each with a fresh backend.

``torch._dynamo.reset()`` comes first every time: plans share the step function's
code object, and without a reset Dynamo would keep (and guard on) the previous
plan's graph or fall back to eager after its recompile limit.
"""

from __future__ import annotations

from typing import Any

import torch

from superkernel.config import MODES, REDUCE_OVERHEAD
from superkernel.tools.decode import DecodeSession, StepFn

__all__ = ["MODES", "REDUCE_OVERHEAD", "compile_inductor", "compile_superkernel", "guard_path_of", "own_code",
           "superkernel_backend"]


def own_code(fn: StepFn, tag: str = "") -> StepFn:
    """``fn`` with a code object of its own (named ``<name>_<tag>`` when ``tag`` is given): Dynamo caches
    (and counts recompiles) per code object, so a step compiled from it keeps its graph while other plans
    compile, without ``torch._dynamo.reset()`` (the auto search keeps its measured candidates alive to
    time them again, interleaved; the benchmarks keep every peer compiled)."""
    import types

    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{tag}") if tag else fn.__code__.replace()
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def superkernel_backend(mode: str, *, run_eagerly: bool = False) -> Any:
    import superkernel

    cfg = superkernel.CompilerConfig()
    cfg.mode = mode
    cfg.debug.run_eagerly = run_eagerly
    return superkernel.get_backend(cfg)


def compile_superkernel(session: DecodeSession, mode: str, *, run_eagerly: bool = False,
                        precompiled: bool | None = None, keep: bool = False) -> tuple[StepFn, Any]:
    """The session's decode step under a new superkernel backend; returns (step, backend).

    ``precompiled`` (default: reduce-overhead, or any mode for a quantized model, not the exactness reference,
    and a cache without Python ints that grow every step — those are dynamic sources a precompiled frame would
    specialize): the step is a ``superkernel.precompile_step``, built now (its seconds in ``step.build_seconds``)
    and called without Dynamo's guard tree; a step that cannot be one precompiled frame is compiled the usual way.
    ``keep``: no reset, the step compiled from :func:`own_code` (other compiled steps stay valid).
    """
    import time

    if not keep:
        torch._dynamo.reset()
    fn = own_code(session.step_fn()) if keep else session.step_fn()
    if precompiled is None:
        from superkernel.tools.quantize import is_quantized

        # max-autotune too for a quantized model: its tensor-subclass weights make Dynamo's guard tree cost
        # ~3 ms a step (benchmarks/results/quant_guard_cost*.md)
        precompiled = ((mode == REDUCE_OVERHEAD or is_quantized(session.model)) and not run_eagerly
                       and not session.growing_ints and not session.compile_dynamic)
    if precompiled:
        import superkernel
        from superkernel.precompiled import FrameUnsupported

        cfg = superkernel.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}})
        start = time.perf_counter()
        try:
            with torch.no_grad(), session.dynamo_config():
                step = superkernel.precompile_step(fn, session.inputs(0), cfg)
        except FrameUnsupported:
            if not keep:
                torch._dynamo.reset()
            fn = own_code(session.step_fn()) if keep else fn
        else:
            step.build_seconds = time.perf_counter() - start
            return step, superkernel.pipeline.backend.find_backend(step)
    backend = superkernel_backend(mode, run_eagerly=run_eagerly)
    return torch.compile(fn, backend=backend, dynamic=session.compile_dynamic), backend


def guard_path_of(step: Any, session: DecodeSession) -> tuple[str, dict[str, float]]:
    """Which checks a call of ``step`` runs (full-guards / precompiled) and the measured cost of one (µs)."""
    from superkernel.static_kernel.step import full_guard_cost_us

    with torch.no_grad(), session.dynamo_config():
        if hasattr(step, "guard_cost_us"):
            return step.guard_path, step.guard_cost_us(*session.inputs(0))
        cost = full_guard_cost_us(getattr(step, "__wrapped__", step), session.inputs(0))
    return "full-guards", ({"dynamo_guards": cost} if cost is not None else {})


def compile_inductor(session: DecodeSession, mode: str | None = None, *, keep: bool = False) -> StepFn:
    """Plain torch.compile (default TorchInductor backend), optionally with a torch.compile mode
    (``keep``: as in :func:`compile_superkernel`)."""
    if not keep:
        torch._dynamo.reset()
    kwargs = {"mode": mode} if mode else {}
    fn = own_code(session.step_fn()) if keep else session.step_fn()
    return torch.compile(fn, dynamic=session.compile_dynamic, **kwargs)
