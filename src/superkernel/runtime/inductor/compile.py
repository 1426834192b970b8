"""Compile one partition (an inference ATen GraphModule) with TorchInductor."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx


def build_tweaks() -> Any:
    """The Inductor tweak every compile of a partition runs under, a static build's too: C++-wrapper builds
    precompile the kernel header (:mod:`superkernel.runtime.inductor.wrapper_pch`; nothing else changes)."""
    from superkernel.runtime.inductor import tweaks

    return tweaks.context("C++-wrapper builds precompile the kernel header")


@contextlib.contextmanager
def partition_reports_no_strides() -> Iterator[None]:
    """Inductor reports a graph's output strides to AOTAutograd through the tracing context, once per graph
    (``TracingContext.output_strides``, an instance attribute); a partition is not the graph's output, so its
    compile reports none: the list is None while it compiles and the graph's own is back after, also when the
    compile fails (a tweak of :data:`superkernel.runtime.inductor.tweaks.TWEAKS`). Intermediate outputs keep
    eager strides: Inductor's ``keep_output_stride``."""
    context = torch._guards.TracingContext.try_get()
    if context is None or not hasattr(context, "output_strides"):
        yield
        return
    saved = context.output_strides
    context.output_strides = None
    try:
        yield
    finally:
        context.output_strides = saved


def inductor_patches(device: str, *, cpp_wrapper: bool = True, autotune: bool = False,
                     pdl: bool = False) -> dict[str, Any]:
    """TorchInductor options for one partition (static kernel builds use the same ones). ``pdl``: Triton
    programmatic dependent launch on CUDA (``cuda.pdl``). On CUDA coordinate descent tuning is always on, as
    in ``torch.compile(mode="max-autotune")``: the decode GEMVs become reductions
    (:meth:`superkernel.runtime.realizations.cuda_rows.InductorCudaGraph.tracing`), which reach the memory
    bandwidth only with tuned block sizes; ``autotune`` adds Inductor's kernel and GEMM search."""
    patches: dict[str, Any] = {"triton.cudagraphs": False, "cpp_wrapper": bool(cpp_wrapper and device == "cpu")}
    if autotune:
        patches["max_autotune"] = True
    if autotune or device == "cuda":
        patches["coordinate_descent_tuning"] = True
    if pdl and device == "cuda":
        patches["triton.enable_pdl"] = True
    return patches


def graph_rewrites(gm: fx.GraphModule, device: str) -> list[str]:
    """superkernel's own rewrites of a partition's ATen graph before Inductor compiles it, in place (the
    decode-sized quantized GEMVs on the CPU: :mod:`superkernel.runtime.inductor.quant_gemv`); one line each.
    A static-kernel build applies them too, so a package runs what the normal compile runs."""
    if device != "cpu":
        return []
    from superkernel.runtime.inductor.quant_gemv import rewrite_quantized_gemv

    return rewrite_quantized_gemv(gm)


def compile_partition(gm: fx.GraphModule, example_inputs: list[Any], *, device: str,
                      cpp_wrapper: bool = True, autotune: bool = False, pdl: bool = False) -> Callable[..., Any]:
    """Compile ``gm`` as one unit and return a plain ``fn(*args)``.

    Called inside AOTAutograd's compile step, so ``example_inputs`` are the FakeTensors
    of the active fake mode, exactly as TorchInductor's own forward compiler gets them.
    On CPU, ``cpp_wrapper`` gives the compiled partition one C++ entry point. Inductor's
    own CUDA graphs stay off: superkernel captures segments itself. What Inductor prints meanwhile
    (autotune tables) is logged at debug level (:mod:`superkernel.runtime.inductor.output`).
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool

    from superkernel.runtime.inductor import tweaks
    from superkernel.runtime.inductor.output import output_logged

    use_cpp_wrapper = bool(cpp_wrapper and device == "cpu")
    patches = inductor_patches(device, cpp_wrapper=cpp_wrapper, autotune=autotune, pdl=pdl)
    patches.pop("cpp_wrapper")  # compile_fx_inner takes it as an argument
    gm = _copy(gm)  # Inductor's passes rewrite the graph in place; identical partitions must stay identical
    rewrites = graph_rewrites(gm, device)
    with tweaks.context("partitions report no output strides"), inductor_config.patch(patches), output_logged(), \
            build_tweaks():
        compiled = compile_fx_inner(
            gm, example_inputs, cudagraphs=BoxedBool(False), is_inference=True, cpp_wrapper=use_cpp_wrapper,
        )

    def run(*args: Any) -> Any:
        return compiled(list(args))

    #: the key of the generated source in Inductor's code cache (equal keys: one build, shared)
    run.source_key = getattr(compiled, "cache_key", None)  # type: ignore[attr-defined]
    run.rewrites = rewrites  # type: ignore[attr-defined]  # what superkernel rewrote before Inductor (explain)
    return run


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with its own graph (constants shared, the frozen-parameters mark kept)."""
    from torch._inductor.freezing_utils import has_frozen_params, record_has_frozen_params

    out = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    if has_frozen_params(gm):
        record_has_frozen_params(out)
    return out
