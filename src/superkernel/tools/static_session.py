"""The decode step a static build compiles, and the build's configuration (shared by ``static-compile``
and its tensor-parallel form, ``static-compile --nproc``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_plan(plan: Path | None) -> None:
    """Read the plan (a bad one raises) before anything is loaded."""
    if plan is not None:
        from superkernel.tools.advisor.plan_file import read_plan

        read_plan(plan)


def build_config(model: Any, build_dir: Path, *, batch_sizes: list[int] | None = None, plan: Path | None = None,
                 mode: str | None = None, compiler_config: Any = None) -> tuple[Any, list[int]]:
    """(the compiler config of a static build, its batch sizes); the plan's scopes (and its quantization) are
    applied to ``model`` (None: only the config)."""
    import copy

    import superkernel
    from superkernel.static_kernel.settings import resolve_build_dir

    build_dir = resolve_build_dir(build_dir)
    cfg = copy.deepcopy(compiler_config) if compiler_config is not None else superkernel.CompilerConfig()
    if plan is not None:
        from superkernel.tools.advisor.plan_file import TORCH_COMPILE, quantize_for_plan, read_plan

        spec = read_plan(plan)
        if spec.backend == TORCH_COMPILE:
            raise ValueError(f"{plan} recommends plain torch.compile (backend: torch.compile), which has no superkernel "
                             "scopes to build; static-compile takes a superkernel plan, or --model without --config")
        cfg.mode = spec.mode
        if model is not None:
            quantize_for_plan(model, spec)  # a plan measured on a quantized model builds the quantized kernels
            superkernel.remove_scopes(model)
            superkernel.apply_scopes(model, spec.scopes, options=spec.options)
    if mode is not None:
        cfg.mode = mode
    cfg.experimental_config.static_kernel.enable = True
    cfg.experimental_config.static_kernel.build_dir = str(build_dir)
    sizes = batch_sizes or list(cfg.experimental_config.static_kernel.batch_sizes) or [1]
    cfg.experimental_config.static_kernel.batch_sizes = sizes
    return cfg, sizes


def check_cache_len(prompt_len: int, max_cache_len: int, warmup: int = 4) -> int:
    """The decode steps a cache of ``max_cache_len`` leaves after the prompt and warm-up (>= 1, else an error)."""
    steps = max_cache_len - prompt_len - warmup
    if steps < 1:
        raise ValueError(f"--max-cache-len {max_cache_len} leaves no decode steps after a {prompt_len}-token prompt "
                         f"(it must be at least prompt-len + {warmup + 1})")
    return steps


def decode_session(model: Any, *, batch: int, prompt_len: int, max_cache_len: int, seed: int = 0,
                   device: str = "cpu") -> Any:
    """A :class:`superkernel.tools.decode.DecodeSession` for ``batch`` sequences, prefilled eagerly.

    Built by ``superkernel.tools.decode.prepare`` (so the captured decode graph is the one the
    harness compiles), without the greedy reference decode the harness runs for its
    precision checks.
    """
    from superkernel.tools.decode import prepare

    warmup = 4
    steps = check_cache_len(prompt_len, max_cache_len)
    return prepare(model, prompt_len=prompt_len, steps=steps, warmup=warmup, seed=seed, device=device, batch=batch,
                   reference_tokens=False, spare_slots=0)  # the package is built for exactly --max-cache-len


def batch_inputs(session: Any, i: int, batch: int) -> tuple[Any, Any]:
    import torch

    ids = session.tokens.reshape(batch, 1)
    pos = torch.tensor([session.prompt_len + i], device=session.device)
    return ids, pos
