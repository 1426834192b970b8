"""max-autotune: TorchInductor compiles each segment, and each unscoped run, as one unit."""

from __future__ import annotations

from typing import Any, Callable

from superkernel.config import CompilerConfig
from superkernel.runtime.realizations.base import Job, Program, Realization


class Inductor(Realization):
    """What every Inductor row shares: Inductor's decompositions, one compile per partition
    (through the static-kernel compiler, which may load it from a package instead)."""

    summary = "TorchInductor compiles the segment as one unit"

    @classmethod
    def decompositions(cls, config: CompilerConfig) -> dict[Any, Any] | None:
        if config.debug.run_eagerly:  # the exactness reference keeps the graph as captured
            return None
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()

    @classmethod
    def compiles(cls, config: CompilerConfig) -> bool:
        return not config.debug.run_eagerly

    def unscoped(self, job: Job) -> Program:
        return job.guarded(lambda: (self.compile(job)[0], "inductor"), job.flat)

    def segment(self, job: Job) -> Program:
        def build() -> tuple[Program, str]:
            fn, suffix = self.compile(job)
            return fn, self.segment_label() + suffix

        return job.guarded(build, job.flat)

    def segment_label(self) -> str:
        return "inductor"

    def compile(self, job: Job) -> tuple[Program, str]:
        """(the partition compiled by Inductor, a label suffix such as ``+frozen``)."""
        fn, suffix = self._compile(job, self._compile_fn(job))
        rewrites = list(getattr(fn, "rewrites", None) or [])
        if rewrites:
            self.counters["quantized_gemv_rewrites"] += len(rewrites)
            if job.info is not None:
                job.info.rewrites = rewrites
        if self.context.config.experimental_config.cuda_decode_kernels:  # (the hookup's operator: explain says so)
            from superkernel.runtime.cuda.decode_kernels.op import describe, layers_in

            layers = layers_in(job.module.gm)
            self.counters["decode_kernel_layers"] += layers
            if layers and job.info is not None:
                job.info.rewrites = [*job.info.rewrites, describe(layers)]
        self.counters["partitions_compiled"] += 1
        if job.module.partition.kind == "segment":
            self.counters["segments_compiled"] += 1
        return fn, suffix

    def _compile_fn(self, job: Job) -> Callable[[], Program]:
        """Compile the partition plainly; a structurally identical partition compiled earlier in this
        graph (the next decoder layer: same code, same input layouts, other weights) reuses its kernel
        (:mod:`superkernel.runtime.inductor.shared_kernels`)."""
        from superkernel.runtime.inductor.compile import compile_partition
        from superkernel.runtime.inductor.shared_kernels import structural_key

        module, inductor, device = job.module, self.config.inductor, self.context.device
        pdl = self.config.cuda.pdl

        def compile_plain() -> Program:
            key = structural_key(module.gm, module.example_inputs, (device, inductor.cpp_wrapper, inductor.autotune, pdl))
            shared = self.__dict__.setdefault("_shared_kernels", {})
            if key is not None and key in shared:
                self.counters["partitions_reused"] += 1
                return shared[key]
            fn = compile_partition(module.gm, module.example_inputs, device=device,
                                   cpp_wrapper=inductor.cpp_wrapper, autotune=inductor.autotune, pdl=pdl)
            self.counters["partitions_inductor_compiles"] += 1
            if key is not None:
                shared[key] = fn
            return fn

        return compile_plain

    def _compile(self, job: Job, compile_fn: Callable[[], Program]) -> tuple[Program, str]:
        module = job.module
        return self.context.static.compile(module.gm, module.example_inputs, compile_fn, name=module.partition.name), ""


class InductorCpu(Inductor):
    """CPU: C++ (one entry point with ``inductor.cpp_wrapper``); a partition whose weights may be
    frozen is also compiled frozen and the faster at the real shapes kept
    (:mod:`superkernel.runtime.inductor.cpu_freezing`)."""

    summary = "TorchInductor C++ per segment, plain or frozen by measurement"

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._reals: tuple[Any, list[Any] | None] | None = None  # (parent graph, its freezable real inputs)

    def segment_label(self) -> str:
        return "inductor-cpp" if self.config.inductor.cpp_wrapper else "inductor-cpu"

    def _compile(self, job: Job, compile_fn: Callable[[], Program]) -> tuple[Program, str]:
        """Static kernels: the plain partition is loaded from the package or built into it. A partition
        the package does not hold is also compiled frozen where allowed and the faster kept; the choice
        is recorded in the package. A frozen variant is never packaged (its weights would have to be), so
        a process loading the partition runs the plain kernel and says so (``+plain-from-package``)."""
        module, static = job.module, self.context.static
        gm, inputs, name = module.gm, module.example_inputs, module.partition.name
        plain = lambda: static.compile(gm, inputs, compile_fn, name=name)  # noqa: E731
        may_freeze = self.context.device == "cpu" and self.config.inductor.freezing is not False and bool(module.inputs)
        if may_freeze and _holds_collectives(gm):
            self.counters["partitions_not_timed_collectives"] += 1
            may_freeze = False
        if not may_freeze:
            return plain(), ""
        held, choice = static.packaged_choice(gm, inputs, name=name)
        if held:
            return plain(), "+plain-from-package" if choice == "frozen" else ""
        best = self._best(job, plain, self._choice_key(job))
        if best.label or best.timings_ms:  # (a frozen variant was compiled: the choice is news)
            static.record_freezing_choice(gm, inputs, "frozen" if best.label else "plain", best.timings_ms)
        return best.fn, best.label

    def _choice_key(self, job: Job) -> Any:
        """The structural key under which a plain-or-frozen choice is shared by identical partitions
        (None: measured on its own; always so with the autofusion planner, whose decisions are per segment)."""
        from superkernel.config import autofusion_enabled
        from superkernel.runtime.inductor.shared_kernels import structural_key

        if autofusion_enabled(self.config):
            return None
        i = self.config.inductor
        options = ("choice", self.context.device, i.cpp_wrapper, i.autotune, str(i.freezing), i.gemm_templates, i.gemm_timing,
                   str(i.bf16_gemv))
        return structural_key(job.module.gm, job.module.example_inputs, options)

    def _best(self, job: Job, compile_plain: Callable[[], Program], key: Any = None) -> Any:
        """The partition compiled plainly and, where the weights may be frozen, frozen too; the faster kept.
        A partition structurally identical to one measured earlier in this graph (the next decoder layer)
        takes that choice without measuring again: plain -> no frozen compile at all, frozen -> compiled
        frozen with its own weights, untimed (``+frozen`` as the first)."""
        from superkernel.runtime.inductor.cpu_freezing import Choice, choose

        module, inductor = job.module, self.config.inductor
        choices = self.__dict__.setdefault("_freezing_choices", {})
        freezing = inductor.freezing
        if key is not None and key in choices:
            self.counters["partitions_choice_reused"] += 1
            if not choices[key]:
                return Choice(compile_plain(), "", {})
            freezing = True
        parent = module.inputs[0].graph.owning_module
        static = self.context.static_input_indices()
        reals = None if self.context.training_graph() else self._freezable_reals(parent, static)
        decisions: list[Any] = []
        rewrite = self._autofusion(decisions)
        choice = choose(module, parent, reals, static, compile_plain, freezing=freezing,
                        cpp_wrapper=inductor.cpp_wrapper, autotune=inductor.autotune,
                        gemm_templates=inductor.gemm_templates, gemm_timing=inductor.gemm_timing, rewrite=rewrite,
                        background_build=not self.context.static.enabled, bf16_gemv=inductor.bf16_gemv)
        if choice.label:
            self.counters["partitions_frozen"] += 1
            self._count_shared_frozen_code(choice.fn)
        if key is not None and key not in choices:
            choices[key] = bool(choice.label)
        if rewrite is not None and job.info is not None:
            from superkernel.ir.decision import record

            job.info.autofusion = record(decisions, frozen_kept=bool(choice.label), timings_ms=choice.timings_ms)
        return choice

    def _count_shared_frozen_code(self, fn: Any) -> None:
        """``partitions_frozen_code_shared``: frozen partitions whose generated code equals one built earlier
        in this backend (an identical layer with other weights: one C++ build, see
        :mod:`superkernel.runtime.inductor.frozen_code`)."""
        key = getattr(fn, "source_key", None)
        if key is None:
            return
        seen = self.__dict__.setdefault("_frozen_sources", set())
        if key in seen:
            self.counters["partitions_frozen_code_shared"] += 1
        seen.add(key)

    def _autofusion(self, decisions: list[Any]) -> Callable[[Any], None] | None:
        """The planner's rewrite for the frozen compile (``inductor.autofusion``), appending its decisions."""
        from superkernel.config import autofusion_enabled

        if not autofusion_enabled(self.config):
            return None
        if "_planner" not in self.__dict__:
            from superkernel.runtime.inductor.autofusion import Planner

            inductor = self.config.inductor
            self._planner = Planner(gemm_templates=inductor.gemm_templates, cpp_wrapper=inductor.cpp_wrapper)
        planner = self._planner

        def rewrite(gm: Any) -> None:
            try:
                decisions.extend(planner.plan(gm))
            except Exception as exc:  # the frozen compile fails with it; the plain one stays
                from superkernel.ir.decision import Decision
                from superkernel.util import exception_summary

                decisions.append(Decision("planner", "failed", "-", exception_summary(exc)))
                raise

        return rewrite

    def _freezable_reals(self, parent: Any, static: list[int]) -> list[Any] | None:
        """The real tensors behind the parent graph's inputs that may be frozen (parameters and
        static inputs; None elsewhere, so nothing keeps a reference to the call's other inputs)."""
        import torch

        from superkernel.runtime.inductor.cpu_freezing import graph_real_inputs

        if self._reals is None or self._reals[0] is not parent:
            reals = graph_real_inputs(parent, self.context.real_inputs)
            if reals is not None:
                reals = [r if isinstance(r, torch.nn.Parameter) or i in static else None for i, r in enumerate(reals)]
            self._reals = (parent, reals)
        return self._reals[1]


def _holds_collectives(gm: Any) -> bool:
    """Choosing plain vs frozen runs the partition a number of times each rank decides by its own
    clock; a collective inside would run a different number of times on each rank, and gloo pairs
    collectives by call order, so ranks would sum the wrong tensors (measured: max-autotune under
    ``--nproc 2`` gave logits off by 0.8, top-1 agreement 8%). Such a partition is compiled plain only."""
    from superkernel.runtime.realizations.collectives import collectives

    return bool(collectives(gm))
