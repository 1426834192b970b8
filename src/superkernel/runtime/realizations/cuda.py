"""CUDA rows: a segment is replayed as one CUDA graph, in both modes."""

from __future__ import annotations

import torch
import torch.fx as fx

from superkernel.pipeline.ir import tensor_values
from superkernel.runtime.realizations.base import Job, Program, Realization
from superkernel.runtime.realizations.collectives import collective_cut_reason
from superkernel.runtime.realizations.inductor import Inductor

CPU_IN_CUDA = "CPU work inside a CUDA scope"


def cpu_in_cuda_reason(node: fx.Node) -> str | None:
    """A CUDA graph would bake a CPU value in at capture time: an operator computing on the CPU, or
    reading a CPU tensor, cannot run inside a CUDA-graph segment."""
    if node.op != "call_function":
        return None
    target = node.target
    name = target.name() if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    if any(t.device.type == "cpu" for t in tensor_values(node.meta.get("val"))):
        return f"{CPU_IN_CUDA}: {name} computes on the CPU"
    for arg in node.all_input_nodes:
        if any(t.device.type == "cpu" for t in tensor_values(arg.meta.get("val"))):
            return f"{CPU_IN_CUDA}: {name} reads the CPU tensor {arg.name} (host-to-device transfer)"
    return None


def cuda_cut_reason(node: fx.Node) -> str | None:
    """What cuts a CUDA-graph segment: CPU work, or a collective the graph cannot capture (not NCCL)."""
    return cpu_in_cuda_reason(node) or collective_cut_reason(node)


def cuda_graph(job: Job, fn: Program, fallback: Program) -> Program:
    """``fn`` captured as CUDA graphs at the first call; ``fallback`` (the flat program) runs if capture fails."""
    from superkernel.runtime.cuda_graph import CudaGraphSegment

    return CudaGraphSegment(fn, job.module.partition.name, job.module.mutated_inputs,
                            on_failure=lambda exc: job.fallback(exc), fallback=fallback)


class CudaGraphReplay(Realization):
    """reduce-overhead on CUDA: the segment's flat program (or, with ``stream-fusion=1``, its
    multi-stream program) captured once and replayed as one CUDA graph. Same kernels: bit-exact."""

    summary = "one CUDA graph per segment, replayed (cuda-graph[+Nstreams])"

    @classmethod
    def cut_reason(cls, node: fx.Node) -> str | None:
        return cuda_cut_reason(node)

    def segment(self, job: Job) -> Program:
        flat = job.flat()  # replayed as a CUDA graph, and the fallback if capture fails
        program, label = flat, "cuda-graph"
        if job.module.partition.options.stream_fusion:
            program, label = self._multi_stream(job.module.gm)

        def build() -> tuple[Program, str]:
            self.counters["segments_cuda_graph"] += 1
            return cuda_graph(job, program, flat), label

        return job.guarded(build, lambda: flat)

    def _multi_stream(self, gm: fx.GraphModule) -> tuple[Program, str]:
        from superkernel.runtime.streams import assign_streams, multi_stream_program, num_streams

        assignment = assign_streams(gm)
        self.counters["segments_multi_stream"] += 1
        return multi_stream_program(gm, assignment), f"cuda-graph+{num_streams(assignment)}streams"


class InductorCudaGraph(Inductor):
    """max-autotune on CUDA: Inductor compiles the segment (Triton), superkernel captures the
    compiled segment as one CUDA graph (Inductor's own CUDA graphs stay off)."""

    summary = "TorchInductor (Triton) per segment, then one CUDA graph"

    @classmethod
    def cut_reason(cls, node: fx.Node) -> str | None:
        return cuda_cut_reason(node)

    def segment(self, job: Job) -> Program:
        def build() -> tuple[Program, str]:
            compiled, suffix = self.compile(job)
            self.counters["segments_cuda_graph"] += 1
            return cuda_graph(job, compiled, job.flat()), "inductor-triton+cuda-graph" + suffix

        return job.guarded(build, job.flat)


