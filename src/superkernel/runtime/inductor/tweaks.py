"""Every torch internal superkernel patches or reads, as one list — what breaks first on a torch upgrade.

Mostly TorchInductor's; the last rows are Dynamo's (entered by ``pipeline``): in a process shared with another
torch.compile user (vLLM), each is in effect only around superkernel's own compiles and calls, or only reads.

Each :class:`Tweak` names the private torch names it replaces or reads (``module:Attr.attr``), when it
applies, and the function (in its own module) that returns its context manager. Compiles enter tweaks from
this list (:func:`frozen_compile`, :func:`context`); a tweak whose names this torch does not have is skipped
with one warning naming them — the compile still runs, without that trick — and ``tests/backend/test_tweaks.py``
fails with the list of what moved (:func:`missing`), so a new torch (or the GPU machines' 2.11) shows it as a
list, not as a traceback in the middle of a compile. Inductor *config* keys superkernel sets are checked the
same way by ``static_kernel.compat`` (unknown keys are dropped there).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Tweak:
    name: str
    touches: tuple[str, ...]  # "module:Attr.attr" of every torch name it replaces or reads
    when: str                 # when it applies (mode, device, ISA, config)
    enter: str                # "module:function" returning its context manager (a read: the function reading)
    after: tuple[str, ...] = ()  # modules to import first (Inductor's modules import each other in one order only)

    def missing(self, resolve: Callable[[str], Any] | None = None) -> list[str]:
        """The touched names this torch does not have."""
        resolve = resolve or resolve_name
        for module in self.after:
            importlib.import_module(module)
        out = []
        for dotted in self.touches:
            try:
                resolve(dotted)
            except (ImportError, AttributeError):
                out.append(dotted)
        return out

    def function(self) -> Callable[..., Any]:
        module, attr = self.enter.split(":")
        return getattr(importlib.import_module(module), attr)


_IND = "superkernel.runtime.inductor"
_PIPE = "superkernel.pipeline"
TWEAKS: tuple[Tweak, ...] = (
    Tweak("reused template parses", ("torch._inductor.codegen.common:KernelTemplate._template_from_string",),
          "CPU max-autotune, frozen compiles: identical GEMM templates are parsed once",
          f"{_IND}.frozen_code:parsed_templates_reused"),
    Tweak("reused index expressions", ("torch._inductor.codegen.cpp_template_kernel:parse_expr_with_index_symbols",),
          "CPU max-autotune, frozen compiles: identical index expressions of C++ templates are parsed once",
          f"{_IND}.frozen_code:parsed_index_expressions_reused", after=("torch._inductor.select_algorithm",)),
    Tweak("value-free constant comments", ("torch._inductor.codegen.cpp_wrapper_cpu:CppWrapperCpu.write_constant",),
          "CPU max-autotune, frozen compiles with cpp_wrapper: generated code names no weight value, so identical "
          "layers with other weights build one module", f"{_IND}.frozen_code:value_free_constant_comments"),
    Tweak("stable int-array names",
          ("torch._inductor.codegen.cpp_wrapper_cpu:CppWrapperCpu.codegen_int_array_var",
           "torch._inductor.codegen.cpp_wrapper_cpu:CppWrapperCpu._codegen_int_array_var_impl"),
          "CPU max-autotune, frozen compiles with cpp_wrapper, on a torch (2.11) whose shape-array cache is keyed by "
          "a bound method's id: identical layers get the same array names, so one module",
          f"{_IND}.frozen_code:stable_int_array_names"),
    Tweak("template builds use the precompiled header", ("torch._inductor:autotune_process",
                                                         "torch._inductor.autotune_process:CppCodeCache",
                                                         "torch._inductor.codecache:CppCodeCache"),
          "CPU max-autotune with GEMM templates: the modules built to time template choices",
          f"{_IND}.autotune_builds:template_builds_use_pch"),
    Tweak("GEMM choices timed from memory", ("torch._inductor.runtime.benchmarking:benchmarker.benchmark_cpu",
                                             "torch._inductor.codecache:CacheBase.get_local_cache_path",
                                             "torch._inductor.select_algorithm:AlgorithmSelectorCache.benchmark_choices"),
          "CPU max-autotune with GEMM templates and inductor.gemm_timing='memory': every timed call after the "
          "caches are evicted, the choices in rotating passes, in a timing store of its own",
          f"{_IND}.gemm_timing:weights_from_memory"),
    Tweak("bf16 GEMV weight loads", ("torch._inductor.codegen.cpp_micro_gemm:CppMicroGemmFP32Vec.TEMPLATE_KERNEL",
                                     "torch._inductor.cpu_vec_isa:pick_vec_isa", "torch._inductor.cpu_vec_isa:VecAVX2"),
          "CPU max-autotune, frozen bf16 weights on an AVX2 CPU without native bf16 (inductor.bf16_gemv)",
          f"{_IND}.bf16_gemv:bf16_weight_loads", after=("torch._inductor.compile_fx",)),
    Tweak("background plain build", ("torch._inductor.codecache:CppWrapperCodeCache.load_pybinding",),
          "CPU max-autotune, plain and frozen variants compiled: the plain variant's g++ build overlaps the frozen "
          "lowering (static kernels off)", f"{_IND}.background_build:builds_in_background"),
    Tweak("C++-wrapper builds precompile the kernel header", (
              "torch._inductor.codecache:CppWrapperCodeCache._get_uncompiled_header",
              "torch._inductor.codecache:_get_cpp_prefix_header"),
          "CPU compiles with cpp_wrapper: the precompiled header of each module's build also holds cpp_prefix.h, "
          "which the module includes and g++ parsed again in every build",
          f"{_IND}.wrapper_pch:wrapper_header_holds_kernel_header"),
    Tweak("real constants in the frozen compile", ("torch._subclasses.fake_tensor:FakeTensorMode",),
          "CPU max-autotune, frozen compiles: the fake mode accepts the real frozen weights "
          "(FakeTensorMode.allow_non_fake_inputs, an instance attribute), as Inductor's own freezing does",
          f"{_IND}.cpu_freezing:real_constants_allowed"),
    Tweak("partitions report no output strides", ("torch._guards:TracingContext.try_get",
                                                  "torch._guards:TracingContext.report_output_strides"),
          "every Inductor compile of a partition: the graph's output strides Inductor reports to AOTAutograd "
          "(TracingContext.output_strides, an instance attribute) are not a partition's; None while it compiles, "
          "the graph's own back afterwards", f"{_IND}.compile:partition_reports_no_strides"),
    Tweak("data-dependent frames traced again", ("torch._dynamo.convert_frame:ConvertFrame.__call__",),
          "while a superkernel-compiled object runs (Dynamo converts its frames lazily, inside its calls) and in "
          "the decode harness: a frame whose conversion with data-dependent values captured fails is converted "
          "again without capturing them; torch's own __call__ is back after the call, and frames of other "
          "threads and backends pass through", f"{_PIPE}.capture_fallback:converter_wrapped"),
    Tweak("compiled objects enter the backend's context", ("torch:_TorchCompileWrapper.__init__",),
          "torch.compile(model, backend=<a superkernel backend>); read, not replaced: the __name__ read this "
          "__init__ makes of the backend gives that one wrapper the backend's backend_ctx_ctor, which Dynamo "
          "enters around every call", f"{_PIPE}.backend_context:hand_context_to_wrapper"),
    Tweak("backend by name found in Dynamo's frame", ("torch._dynamo.convert_frame:_compile",),
          "every compile start; read, not replaced: the backend in _compile's compiler_fn argument. "
          "torch.compile(model, backend=\"superkernel\") traces in that backend's context; another backend's "
          "compile (vLLM's), even inside a superkernel call, gets nothing of ours",
          f"{_PIPE}.backend_context:context_of_this_compile"),
)
BY_NAME = {t.name: t for t in TWEAKS}


def resolve_name(dotted: str) -> Any:
    """``"module:Attr.attr"`` -> the object (ImportError / AttributeError when torch moved it)."""
    module, _, attrs = dotted.partition(":")
    obj = importlib.import_module(module)
    for attr in filter(None, attrs.split(".")):
        obj = getattr(obj, attr)
    return obj


def missing(tweaks: tuple[Tweak, ...] = TWEAKS, resolve: Callable[[str], Any] | None = None) -> list[str]:
    """``"name (tweak)"`` for every touched name this torch does not have; [] when all are there."""
    return [f"{dotted} ({t.name})" for t in tweaks for dotted in t.missing(resolve)]


_WARNED: set[str] = set()


def context(name: str, *args: Any, absent: Any = None, **kwargs: Any) -> Any:
    """The context manager of tweak ``name`` (from :data:`TWEAKS`); a null context giving ``absent``, with one
    warning, when this torch lacks a name it touches."""
    tweak = BY_NAME[name]
    gone = tweak.missing()
    if gone:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"superkernel: this torch has no {', '.join(gone)}; the compile runs without the "
                          f"'{name}' tweak ({tweak.when})", RuntimeWarning, stacklevel=2)
        return contextlib.nullcontext(absent)
    return tweak.function()(*args, **kwargs)


@contextlib.contextmanager
def frozen_compile(*, gemm_templates: bool, gemm_timing: str, bf16_gemv: Any, step: int | None = None) -> Iterator[None]:
    """The tweaks a CPU frozen compile runs under, entered from :data:`TWEAKS` (``step``: the bytes the whole
    graph reads, for the GEMM timing)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(context("reused template parses"))
        stack.enter_context(context("reused index expressions"))
        stack.enter_context(context("template builds use the precompiled header", None if gemm_templates else False))
        stack.enter_context(context("GEMM choices timed from memory", gemm_templates and gemm_timing == "memory", step))
        stack.enter_context(context("bf16 GEMV weight loads", bf16_gemv))
        yield


__all__ = ["BY_NAME", "TWEAKS", "Tweak", "context", "frozen_compile", "missing", "resolve_name"]
