"""``model.generate()`` with a superkernel plan: one call, then generate as usual.

    superkernel.apply_for_generate(model, "superkernel.yaml")          # a saved plan
    superkernel.apply_for_generate(model, "decoder_layer", mode="reduce-overhead")   # or a strategy
    out = model.generate(input_ids, max_new_tokens=32, do_sample=False)

It puts the plan's scopes on the model (in place, earlier scopes removed) and sets the
model's ``generation_config`` so that ``generate()`` uses a static KV cache and compiles
its **decode** steps with the superkernel backend: transformers' own automatic compilation
(``generation_config.compile_config``) compiles ``model.__call__`` for the steps after the
prefill, and runs the prefill (the prompt, a new length every call) uncompiled, so the
prompt never triggers a compile and scopes act on the decode steps only (docs/workflow.md).
``transformers`` compiles only on GPUs by default; the config here allows every device.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from superkernel.runtime.cuda.decode_kernels import hookup as decode_kernels
from superkernel.tools import generate_cache, generate_guards, generate_int4_prompt
from superkernel.tools.advisor.plan_file import TORCH_COMPILE, PlanFile, read_plan

def _strategies() -> tuple[str, ...]:
    """Strategies ``apply_for_generate`` accepts by name (a plan file or dict gives its own scopes)."""
    from superkernel.tools.advisor.strategies import STRATEGIES

    return tuple(s for s in STRATEGIES if s not in ("auto", "custom"))


def resolve_plan(model: Any, plan: str | Path | Mapping[str, Any], mode: str | None) -> PlanFile:
    """A :class:`PlanFile` from a plan path, a plan dict, or a strategy name with a mode."""
    from superkernel.config import MODES

    if isinstance(plan, str) and plan in _strategies():
        from superkernel.tools.advisor.strategies import plan_for
        from superkernel.tools.advisor.structure import analyze_structure

        if mode is None:
            raise ValueError(f"strategy {plan!r} needs a mode: mode='reduce-overhead' or mode='max-autotune'")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        scopes = plan_for(plan, analyze_structure(model)).scopes
        return PlanFile(scopes=scopes, mode=mode, strategy=plan)
    if isinstance(plan, str) and not plan.endswith((".yaml", ".yml")) and not Path(plan).exists():
        raise ValueError(f"{plan!r} is neither a plan file nor a strategy; strategies: {', '.join(_strategies())}")
    return read_plan(plan)


def compile_config(backend: Any, mode: str | None = None) -> Any:
    """transformers' ``CompileConfig`` for ``backend``, allowed on every device, one graph per shape.

    ``generate()`` deep-copies its generation config on every call and compiles anew when
    the compile config differs from the last one; a copied backend object would differ
    (and Dynamo would recompile on its backend guard) every call. This config is shared
    rather than copied, so every ``generate()`` reuses one backend and its compiled step.
    """
    from transformers import CompileConfig

    class SharedCompileConfig(CompileConfig):
        def __deepcopy__(self, memo: dict) -> "SharedCompileConfig":
            return self

        def to_dict(self) -> dict[str, Any]:
            return {k: v for k, v in self.__dict__.items() if k != "_compile_all_devices"}

    config = SharedCompileConfig(fullgraph=False, dynamic=False, backend=backend, mode=mode)
    config._compile_all_devices = True  # transformers compiles on GPUs only unless told otherwise
    return config


#: Where :func:`apply_for_generate` keeps the generation config's ``use_cache`` it turned on.
_USE_CACHE_BEFORE = "_superkernel_use_cache_before"


def apply_for_generate(model: Any, plan: str | Path | Mapping[str, Any], *, mode: str | None = None,
                       compiler_config: Any = None, max_cache_len: int | None = None) -> Any:
    """Make ``model.generate()`` decode with a superkernel plan; returns ``model`` (changed in place).

    ``plan``: a ``superkernel.yaml`` path, a plan dict, or a strategy name (``attention``,
    ``mlp``, ``moe``, ``decoder_layer``, ``all_layers``) together with ``mode``. ``mode``
    overrides a plan's mode. A ``backend: torch.compile`` plan compiles the decode steps
    with plain ``torch.compile`` (default Inductor). ``generate()`` then uses a static
    cache (``cache_implementation="static"``) unless a call passes another, with ``use_cache``
    turned on where the model's generation config turns it off (:func:`remove_for_generate`
    puts it back). ``compiler_config``: the ``CompilerConfig`` the plan's mode and Inductor
    settings are applied to (a copy; default a fresh one). With its
    ``experimental_config.cuda_decode_kernels`` on, a covered Llama model's decode steps run
    superkernel's own Triton kernels in max-autotune on CUDA (``decode_kernels.hookup``; an
    uncovered model warns once with the reason and keeps Inductor's kernels; docs/gpu.md).
    A call longer than all before it (it compiles the step again) gets a static cache of the power
    of two at or above its length, so the next compile comes when a call doubles it;
    ``max_cache_len``: the least length every call gets (one compile for every call up to it;
    :mod:`superkernel.tools.generate_cache`).
    Dynamo's guards are checked on a decode step until a step of the same signature (the cache,
    the shapes) has run without compiling, then skipped (:mod:`superkernel.tools.generate_guards`).
    Under a max-autotune plan an int4 model's prompt runs superkernel's int4 kernel
    (:mod:`superkernel.tools.generate_int4_prompt`).
    """
    import superkernel

    spec = resolve_plan(model, plan, mode)
    from superkernel.tools.advisor.plan_file import quantize_for_plan

    if max_cache_len is not None and (isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int)
                                      or max_cache_len < 1):
        raise ValueError(f"max_cache_len must be a positive number of positions, got {max_cache_len!r}")

    quantize_for_plan(model, spec)  # a plan measured on a quantized model quantizes a float one the same way
    superkernel.remove_scopes(model)
    decode_kernels.remove(model)
    generate_int4_prompt.remove(model)
    compile_mode = None
    if spec.backend == TORCH_COMPILE:
        backend: Any = "inductor"
        compile_mode = spec.mode  # None, or reduce-overhead (a CUDA plan)
    else:
        cfg = copy.deepcopy(compiler_config) if compiler_config is not None else superkernel.CompilerConfig()
        cfg.mode = mode or spec.mode
        cfg.inductor.update(spec.inductor)
        decode_kernels.install(model, cfg)  # before the scopes: they wrap the forward it gives the layers
        superkernel.apply_scopes(model, spec.scopes, options=spec.options)
        backend = superkernel.get_backend(cfg)
        if cfg.mode == "max-autotune":
            generate_int4_prompt.install(model)
    model.generation_config.compile_config = compile_config(backend, compile_mode)
    model.generation_config.cache_implementation = "static"
    generate_cache.install(model, max_cache_len)
    generate_guards.install(model)
    model.generation_config.disable_compile = False
    if model.generation_config.use_cache is not True:
        # Some configs default to no cache (MPT): generate() would then ignore the static cache and
        # skip compilation, and the plan would silently do nothing.
        if not hasattr(model, _USE_CACHE_BEFORE):
            setattr(model, _USE_CACHE_BEFORE, model.generation_config.use_cache)
        model.generation_config.use_cache = True
    return model


def remove_for_generate(model: Any) -> Any:
    """Undo :func:`apply_for_generate`: no scopes, no compile config, transformers' default cache."""
    import superkernel

    superkernel.remove_scopes(model)
    decode_kernels.remove(model)
    generate_int4_prompt.remove(model)
    generate_cache.remove(model)
    generate_guards.remove(model)
    model.generation_config.compile_config = None
    model.generation_config.cache_implementation = None
    if hasattr(model, _USE_CACHE_BEFORE):
        model.generation_config.use_cache = getattr(model, _USE_CACHE_BEFORE)
        delattr(model, _USE_CACHE_BEFORE)
    for attr in ("_compiled_call", "_last_compile_config"):
        if hasattr(model, attr):
            delattr(model, attr)
    return model
