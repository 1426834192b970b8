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

__all__ = ["MODES", "REDUCE_OVERHEAD", "compile_inductor", "compile_superkernel", "superkernel_backend"]


def superkernel_backend(mode: str, *, run_eagerly: bool = False) -> Any:
    import superkernel

    cfg = superkernel.CompilerConfig()
    cfg.mode = mode
    cfg.debug.run_eagerly = run_eagerly
    return superkernel.get_backend(cfg)


def compile_superkernel(session: DecodeSession, mode: str, *, run_eagerly: bool = False) -> tuple[StepFn, Any]:
    """The session's decode step under a new superkernel backend; returns (step, backend)."""
    torch._dynamo.reset()
    backend = superkernel_backend(mode, run_eagerly=run_eagerly)
    return torch.compile(session.step_fn(), backend=backend, dynamic=False), backend


def compile_inductor(session: DecodeSession, mode: str | None = None) -> StepFn:
    """Plain torch.compile (default TorchInductor backend), optionally with a torch.compile mode."""
    torch._dynamo.reset()
    kwargs = {"mode": mode} if mode else {}
    return torch.compile(session.step_fn(), dynamic=False, **kwargs)
