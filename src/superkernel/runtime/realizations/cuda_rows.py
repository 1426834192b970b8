"""CUDA rows: the decode step replays as one CUDA graph (several when cuts split it), in both modes.

A segment's callable is its kernels back to back (reduce-overhead: the flat ATen program, or with
``stream-fusion=1`` its multi-stream program; max-autotune: the Inductor-compiled segment). The
row then makes the graph's whole step itself (:meth:`Realization.step`): every run of partitions
between cuts, glue included, is captured as one CUDA graph (:mod:`superkernel.runtime.cuda.step_graph`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.ir.graph import tensor_values
from superkernel.runtime.realizations.base import Job, Program, Realization
from superkernel.runtime.realizations.collectives import collective_cut_reason
from superkernel.runtime.realizations.inductor_rows import Inductor

CPU_IN_CUDA = "CPU work inside a CUDA graph"


def _constant_cpu_scalar(node: fx.Node) -> bool:
    """A 0-dim CPU tensor computed from constants only (``torch.tensor(0.5)`` in model code): the same value
    at every replay, so a CUDA graph may bake it in."""
    vals = tensor_values(node.meta.get("val"))
    if len(vals) != 1 or vals[0].device.type != "cpu" or vals[0].dim() != 0:
        return False
    if node.op == "get_attr":
        return True
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags or node.target._schema.is_mutable:
        return False
    return all(_constant_cpu_scalar(a) for a in node.all_input_nodes)


def _takes_cpu_scalars_by_value(node: fx.Node) -> bool:
    """A pointwise CUDA operator: TensorIterator reads a 0-dim CPU operand on the host and passes it to the
    kernel by value (no host-to-device copy; a capture records the value)."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags
            and all(t.device.type == "cuda" for t in tensor_values(node.meta.get("val"))))


def cpu_in_cuda_reason(node: fx.Node) -> str | None:
    """A CUDA graph would bake a CPU value in at capture time: an operator computing on the CPU, or
    reading a CPU tensor, cannot run inside a CUDA graph — unless the value is a 0-dim constant that a
    pointwise CUDA kernel takes by value (the same at every replay)."""
    if node.op != "call_function":
        return None
    if _constant_cpu_scalar(node) and node.users and all(
            _takes_cpu_scalars_by_value(u) or _constant_cpu_scalar(u) for u in node.users):
        return None  # computed once, at capture, from constants
    target = node.target
    name = target.name() if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    if any(t.device.type == "cpu" for t in tensor_values(node.meta.get("val"))):
        return f"{CPU_IN_CUDA}: {name} computes on the CPU"
    cpu_inputs = [a for a in node.all_input_nodes if any(t.device.type == "cpu" for t in tensor_values(a.meta.get("val")))]
    if cpu_inputs and _takes_cpu_scalars_by_value(node) and all(_constant_cpu_scalar(a) for a in cpu_inputs):
        return None  # the constant is baked in at capture
    if cpu_inputs and _takes_cpu_scalars_by_value(node):
        return (f"{CPU_IN_CUDA}: {name} reads the CPU scalar {cpu_inputs[0].name}, which a capture would bake in "
                "(it may change between calls)")
    if cpu_inputs:
        return f"{CPU_IN_CUDA}: {name} reads the CPU tensor {cpu_inputs[0].name} (host-to-device transfer)"
    return None


def cuda_cut_reason(node: fx.Node) -> str | None:
    """What cuts a CUDA graph: CPU work, or a collective the graph cannot capture (not NCCL)."""
    return cpu_in_cuda_reason(node) or collective_cut_reason(node)


class _StepGraphs:
    """What both CUDA rows share: the cut rules, and the step made of CUDA graphs."""

    counters: Any
    context: Any
    config: Any
    #: listen for host syncs in the warm-up call (off where the warm-up itself may legitimately sync:
    #: Triton kernels with several configs autotune at their first call and synchronize to time them)
    sync_check = True

    @classmethod
    def cut_reason(cls, node: fx.Node) -> str | None:
        return cuda_cut_reason(node)

    @classmethod
    def splits_unscoped(cls, config: Any) -> bool:
        return True

    def step(self, gm: fx.GraphModule, modules: list[Any], callables: list[Program], info: Any,
             problem: Callable[[str, list[Any]], None]) -> Program:
        from superkernel.runtime.cuda.driver import current_driver
        from superkernel.runtime.cuda.step_graph import build_step_graphs

        driver = current_driver()
        device = _graph_device(gm)
        pool_key = f"cuda_graph_pool:{device}"
        if pool_key not in self.context.shared:
            self.context.shared[pool_key] = driver.new_pool(device)
        by_name = {m.partition.name: m for m in modules}
        step, graphs = build_step_graphs(
            gm, modules, callables, static_indices=self.context.static_input_indices(), device=device,
            pool=self.context.shared[pool_key], driver=driver, graph_name=info.name,
            on_problem=lambda text, names: problem(text, [by_name[n] for n in names if n in by_name]),
            max_captures=self.config.cuda.max_captures, check_syncs=self.config.cuda.sync_check and self.sync_check)
        info.cuda_graphs = graphs
        self.counters["cuda_graphs"] += len(graphs)
        return step


def _graph_device(gm: fx.GraphModule) -> torch.device:
    """The CUDA device the graph's tensors live on (the first one found; cuda:current when none says)."""
    for node in gm.graph.nodes:
        for t in tensor_values(node.meta.get("val")):
            if t.device.type != "cpu":
                return t.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")


class CudaGraphReplay(_StepGraphs, Realization):
    """reduce-overhead on CUDA: each segment its flat ATen program (or, with ``stream-fusion=1``, its
    multi-stream program), the step captured as one CUDA graph. Same kernels as eager: bit-exact."""

    summary = "the step as one CUDA graph; a segment is its kernels back to back (cuda-graph[+Nstreams])"

    def segment(self, job: Job) -> Program:
        if not job.module.partition.options.stream_fusion:
            if job.info is not None:
                job.info.realization = "cuda-graph"
            return job.flat()

        def build() -> tuple[Program, str]:
            return self._multi_stream(job.module.gm)

        return job.guarded(build, job.flat)

    def _multi_stream(self, gm: fx.GraphModule) -> tuple[Program, str]:
        from superkernel.runtime.cuda.streams import assign_streams, multi_stream_program, num_streams

        assignment = assign_streams(gm)
        self.counters["segments_multi_stream"] += 1
        return multi_stream_program(gm, assignment), f"cuda-graph+{num_streams(assignment)}streams"


class InductorCudaGraph(_StepGraphs, Inductor):
    """max-autotune on CUDA: Inductor compiles each segment and each unscoped run (Triton; Inductor's own
    CUDA graphs stay off, ``cuda.pdl``: programmatic dependent launch), the step captured as one CUDA graph."""

    summary = "TorchInductor (Triton) per segment, the step as one CUDA graph"
    sync_check = False

    @classmethod
    def tracing(cls, config: Any) -> Any:
        """Trace as ``torch.compile(mode="max-autotune")`` does: Inductor's decomposition of ``mm`` turns a
        one-row product (the decode GEMV) into a multiply-and-sum that Inductor fuses with its neighbours (the
        norm before, the activation after), but only when coordinate descent tuning is on while AOTAutograd
        traces (compile_partition keeps it on for the compile, which tunes those reductions). Measured on a
        Llama-3.2-1B-shaped bf16 step on an H200 (benchmarks/results/gpu_decode_llama-1b_ma_gap_H200_run2.md):
        1.48 ms/step with the GEMVs left to cuBLAS, 1.18 ms as reductions (torch.compile max-autotune 1.13 ms),
        at twice the compile time (21 s to 43 s)."""
        from torch._inductor import config as inductor_config

        return inductor_config.patch(coordinate_descent_tuning=True)

    def segment_label(self) -> str:
        return "inductor-triton+cuda-graph"
