"""Realize one partition of the graph as one callable, per mode and device.

=================  =========================================  ======================================
partition          reduce-overhead                            max-autotune
=================  =========================================  ======================================
scope segment      CPU: one native call running the segment's TorchInductor compiles the segment as
                   ATen program from C++ (cpu-native; the     one unit (CPU: C++ with cpp_wrapper;
                   flat Python program with cpu.native off    CUDA: Triton, then one CUDA graph)
                   or as the fallback)
                   CUDA: one CUDA graph, replayed
unscoped run       operator by operator (CPU: called from     TorchInductor, as a normal graph
                   the graph's native module)
cut operator       alone, operator by operator                alone, operator by operator
=================  =========================================  ======================================

A partition that fails to compile or capture falls back to running operator by
operator, alone, with one warning; ``strict-scope-check=abort`` raises instead.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Callable

from superkernel.config import CompilerConfig
from superkernel.pipeline.ir import SegmentInfo, SuperKernelScopeError
from superkernel.pipeline.partition import PartitionModule
from superkernel.util import exception_summary


class SuperKernelFallbackWarning(UserWarning):
    """A segment could not be compiled or captured and runs eagerly instead."""


class Realizer:
    def __init__(self, config: CompilerConfig, device: str, counters: Counter[str], static_kernels: Any = None) -> None:
        self.config = config
        self.device = device
        self.counters = counters
        self.static_kernels = static_kernels
        self._native: Any = None  # NativeGroup of this graph's native CPU segments, built as one module
        self._parent_reals: tuple[Any, Any] | None = None  # (graph, its real inputs) for CPU freezing
        self._frozen_label = ""
        self._frozen_timings: dict[str, float] = {}

    def realize(self, module: PartitionModule, info: SegmentInfo | None) -> Callable[..., Any]:
        from superkernel.runtime.cpu import flat_program

        part = module.partition

        def eager() -> Callable[..., Any]:
            """Operator by operator: the partition's straight-line ATen program (same kernels).
            Built only where it runs (generating it for a large partition takes a while)."""
            return flat_program(module.gm)

        if part.kind == "cut":
            return eager()
        mode = self.config.mode
        if part.kind == "unscoped":
            if mode == "max-autotune":
                return self._guarded(module, info, lambda: self._inductor(module), eager)
            if self.device == "cpu" and self.config.cpu.native:
                return self._native_unscoped(module, eager())
            return eager()
        if mode == "reduce-overhead":
            if self.device == "cuda":
                flat = eager()  # replayed as a CUDA graph, and the fallback if capture fails
                program, label = flat, "cuda-graph"
                if part.options.stream_fusion:
                    program, label = self._multi_stream(module)
                return self._guarded(module, info, lambda: self._cuda_graph(module, info, program, flat),
                                     lambda: flat, label)
            return self._cpu_reduce_overhead(module, info, eager())
        kind = "inductor-triton" if self.device == "cuda" else ("inductor-cpp" if self.config.inductor.cpp_wrapper else "inductor-cpu")

        def build() -> Callable[..., Any]:
            compiled = self._inductor(module)
            if self.device == "cuda":
                return self._cuda_graph(module, info, compiled, eager())
            return compiled

        self._frozen_label, self._frozen_timings = "", {}
        fn = self._guarded(module, info, build, eager, kind + ("+cuda-graph" if self.device == "cuda" else ""))
        if info is not None and info.fallback is None and self._frozen_label:
            info.realization += self._frozen_label  # e.g. inductor-cpp+frozen (CPU, chosen by measurement)
        return fn

    # -- helpers ---------------------------------------------------------------------
    def _cpu_reduce_overhead(self, module: PartitionModule, info: SegmentInfo | None,
                             flat: Callable[..., Any]) -> Callable[..., Any]:
        """One native call per segment (the same ATen operators from C++); the flat program
        when native realization is off, cannot express the segment, or fails to build."""
        if not self.config.cpu.native:
            self.counters["segments_flat"] += 1
            if info is not None:
                info.realization = "cpu-flat"
            return flat
        self._native_group()

        def failed(exc: BaseException) -> None:
            self.counters["segments_native"] -= 1
            self.counters["segments_flat"] += 1
            self.fallback(module, info, exc, realization="cpu-flat")

        try:
            segment = self._native.add(module.partition.name, module.gm, flat, on_failure=failed,
                                       inference=self._inference_graph())
        except SuperKernelScopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. an operator the emitter cannot express: flat, reported
            self.counters["segments_flat"] += 1
            self.fallback(module, info, exc, realization="cpu-flat")
            return flat
        self.counters["segments_native"] += 1
        if info is not None:
            info.realization = "cpu-native"
        return segment

    def _native_unscoped(self, module: PartitionModule, flat: Callable[..., Any]) -> Callable[..., Any]:
        """An unscoped run in CPU reduce-overhead still runs operator by operator, without superkernel
        treatment; the native module only calls those operators from C++ instead of Python (same
        kernels, same order). Anything it cannot express, or a failed build, runs the flat program
        without a warning: no segment was asked for here."""
        from superkernel.runtime.native import NativeUnsupported

        self._native_group()
        try:
            return self._native.add(module.partition.name, module.gm, flat, inference=self._inference_graph())
        except NativeUnsupported:
            return flat

    def _native_group(self) -> Any:
        """This graph's NativeGroup; with static kernels, its module comes from the package (or is packaged)."""
        if self._native is None:
            from superkernel.runtime.native import NativeGroup

            provider = self.static_kernels.native_provider(self.device) if self.static_kernels is not None else None
            self._native = NativeGroup(provider=provider)
        return self._native

    @staticmethod
    def _inference_graph() -> bool:
        """The graph being compiled is an inference graph: AOTAutograd says no output requires grad."""
        import torch

        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        infos = getattr(meta, "output_info", None)
        return infos is not None and not any(getattr(o, "requires_grad", False) for o in infos)

    def finish(self) -> None:
        """Build what is still pending (the graph's native module), now rather than at the first call."""
        if self._native is not None:
            self._native.build()

    def _guarded(self, module: PartitionModule, info: SegmentInfo | None, build: Callable[[], Callable[..., Any]],
                 eager: Callable[[], Callable[..., Any]], realization: str = "inductor") -> Callable[..., Any]:
        """``build()``; if it fails, the fallback ``eager()`` (with one warning)."""
        try:
            fn = build()
        except SuperKernelScopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back, reported
            self.fallback(module, info, exc)
            return eager()
        if info is not None:
            info.realization = realization
        return fn

    def fallback(self, module: PartitionModule, info: SegmentInfo | None, exc: BaseException,
                 realization: str = "eager") -> None:
        part = module.partition
        cause = exception_summary(exc)
        where = f"segment {part.name!r} of scope {part.scope!r}" if part.scope else f"unscoped partition {part.name!r}"
        if part.kind == "segment" and part.options.abort_on_cut:
            raise SuperKernelScopeError(f"strict-scope-check=abort: {where} failed to compile/capture: {cause}") from exc
        warnings.warn(f"superkernel: {where} falls back to eager: {cause}", SuperKernelFallbackWarning, stacklevel=3)
        self.counters["fallbacks"] += 1
        if info is not None:
            info.realization = realization
            info.fallback = cause

    def _inductor(self, module: PartitionModule) -> Callable[..., Any]:
        from superkernel.runtime.inductor import compile_partition

        compile_fn = lambda: compile_partition(  # noqa: E731
            module.gm, module.example_inputs, device=self.device,
            cpp_wrapper=self.config.inductor.cpp_wrapper, autotune=self.config.inductor.autotune)
        may_freeze = self.device == "cpu" and self.config.inductor.freezing is not False and bool(module.inputs)
        if self.static_kernels is not None:
            fn = self._inductor_static(module, compile_fn, may_freeze)
        elif may_freeze:
            fn = self._inductor_cpu_best(module, compile_fn)
        else:
            fn = compile_fn()
        self.counters["partitions_compiled"] += 1
        if module.partition.kind == "segment":
            self.counters["segments_compiled"] += 1
        return fn

    def _inductor_static(self, module: PartitionModule, compile_fn: Callable[[], Callable[..., Any]],
                         may_freeze: bool) -> Callable[..., Any]:
        """Static kernels: the plain partition is loaded from the package or built into it. On CPU a
        partition the package does not hold yet is also compiled frozen and the faster kept, as without
        static kernels; the choice is recorded in the package. A frozen variant is never packaged (its
        weights would have to be), so a process loading the partition runs the plain kernel and says so."""
        sk, gm, inputs, name = self.static_kernels, module.gm, module.example_inputs, module.partition.name
        static = lambda: sk.compile(gm, inputs, compile_fn, name=name)  # noqa: E731
        if not may_freeze:
            return static()
        held, choice = sk.packaged_choice(gm, inputs, name=name)
        if held:
            fn = static()
            if choice == "frozen":
                self._frozen_label = "+plain-from-package"  # the build measured frozen faster; not carried
            return fn
        fn = self._inductor_cpu_best(module, static)
        if self._frozen_label or self._frozen_timings:  # (a frozen variant was compiled: the choice is news)
            sk.record_freezing_choice(gm, inputs, "frozen" if self._frozen_label else "plain", self._frozen_timings)
        return fn

    def _inductor_cpu_best(self, module: PartitionModule, compile_fn: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
        """CPU: the partition compiled plainly and, where the weights may be frozen, frozen too;
        the faster at the real shapes is kept (superkernel.runtime.inductor_cpu)."""
        import torch

        from superkernel.runtime.inductor_cpu import choose, graph_real_inputs

        parent = module.inputs[0].graph.owning_module
        context = torch._guards.TracingContext.try_get()
        meta = getattr(context, "fw_metadata", None)
        static = list(getattr(meta, "static_input_indices", None) or ())
        if self._parent_reals is None or self._parent_reals[0] is not parent:
            reals = graph_real_inputs(parent)
            if reals is not None:  # keep only what may be frozen: no reference to the call's other inputs
                reals = [r if isinstance(r, torch.nn.Parameter) or i in static else None for i, r in enumerate(reals)]
            self._parent_reals = (parent, reals)
        # A graph whose outputs require grad is the forward of a training step: never frozen.
        training = any(getattr(o, "requires_grad", False) for o in getattr(meta, "output_info", None) or ())
        choice = choose(module, parent, None if training else self._parent_reals[1], static, compile_fn,
                        freezing=self.config.inductor.freezing, cpp_wrapper=self.config.inductor.cpp_wrapper,
                        autotune=self.config.inductor.autotune, gemm_templates=self.config.inductor.gemm_templates)
        if choice.label:
            self.counters["partitions_frozen"] += 1
        self._frozen_label = choice.label
        self._frozen_timings = dict(choice.timings_ms)
        return choice.fn

    def _multi_stream(self, module: PartitionModule) -> tuple[Callable[..., Any], str]:
        from superkernel.runtime.streams import assign_streams, multi_stream_program, num_streams

        assignment = assign_streams(module.gm)
        self.counters["segments_multi_stream"] += 1
        return multi_stream_program(module.gm, assignment), f"cuda-graph+{num_streams(assignment)}streams"

    def _cuda_graph(self, module: PartitionModule, info: SegmentInfo | None, fn: Callable[..., Any],
                    fallback: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` captured as CUDA graphs; ``fallback`` (the flat program) runs if capture fails."""
        from superkernel.runtime.cuda_graph import CudaGraphSegment

        self.counters["segments_cuda_graph"] += 1
        return CudaGraphSegment(fn, module.partition.name, module.mutated_inputs,
                                on_failure=lambda exc: self.fallback(module, info, exc), fallback=fallback)
