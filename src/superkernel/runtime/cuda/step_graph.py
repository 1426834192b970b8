"""A compiled graph's step as few CUDA graphs as its cuts allow: one, when nothing splits it.

The partitions of a graph (segments, the unscoped glue between them, cut operators) run in order.
Every maximal run of partitions without a cut between them becomes one callable (the partitions'
own callables back to back: a superkernel stays its segment's kernels in a row) captured as one
CUDA graph by a :class:`~.graph_runner.GraphRunner`; each cut runs between the graphs, uncaptured.
A run's inputs that are Dynamo's static inputs (weights, a static cache), that the run writes, or
that an earlier graph produced are used in place; the rest are copied into private buffers. The
step's outputs that are graph buffers are copied out once, at the end (:class:`CopyOut`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from superkernel.ir.graph import CaptureInfo
from superkernel.runtime.cuda.graph_runner import GraphRunner, storage_key

Program = Callable[..., Any]


@dataclass
class Run:
    """A run of partitions as one unit of the top-level step: what it reads and what it defines for later."""

    modules: list[Any]                       # PartitionModule-like: .partition, .inputs, .outputs, .mutated_inputs
    callables: list[Program]
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)

    @property
    def captured(self) -> bool:
        return not (len(self.modules) == 1 and self.modules[0].partition.kind == "cut")

    @property
    def names(self) -> list[str]:
        return [m.partition.name for m in self.modules]


def runs_of(modules: Sequence[Any], callables: Sequence[Program]) -> list[Run]:
    """Consecutive partitions between cuts, each cut a run of its own."""
    runs: list[Run] = []
    for module, fn in zip(modules, callables):
        if module.partition.kind == "cut" or not runs or not runs[-1].captured:
            runs.append(Run([module], [fn]))
        else:
            runs[-1].modules.append(module)
            runs[-1].callables.append(fn)
    later_uses: set[fx.Node] = set()
    for run in reversed(runs):  # a run's outputs: what it defines that a later run or the graph's output reads
        defined = {n for m in run.modules for n in m.outputs}
        read = [n for m in run.modules for n in m.inputs if n not in defined]
        run.inputs = list(dict.fromkeys(read))
        run.outputs = [n for m in run.modules for n in m.outputs if n in later_uses or _is_graph_output(n)]
        later_uses.update(run.inputs)
    return runs


def _is_graph_output(node: fx.Node) -> bool:
    return any(u.op == "output" for u in node.users)


def run_program(gm: fx.GraphModule, run: Run) -> fx.GraphModule:
    """The run's partitions' callables back to back: placeholders for the run's inputs, a tuple of its outputs."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in run.inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for module, fn in zip(run.modules, run.callables):
        call = graph.call_function(fn, tuple(env[n] for n in module.inputs))
        for k, out in enumerate(module.outputs):
            env[out] = graph.call_function(operator.getitem, (call, k))
    graph.output(tuple(env[n] for n in run.outputs))
    return fx.GraphModule(gm, graph, class_name="CapturedRun")


class CopyOut:
    """The step, with every output that is a CUDA graph's buffer copied out once (the graph
    overwrites its buffers at the next replay)."""

    def __init__(self, step: Program, owned: set[int]) -> None:
        self.step = step
        self.owned = owned

    def __call__(self, *args: Any) -> Any:
        out = self.step(*args)
        owned = self.owned
        if not owned:
            return out
        copied = [o.clone() if isinstance(o, torch.Tensor) and storage_key(o) in owned else o for o in out]
        return type(out)(copied) if isinstance(out, tuple) else copied


def build_step_graphs(gm: fx.GraphModule, modules: Sequence[Any], callables: Sequence[Program], *,
                      static_indices: Sequence[int], device: torch.device, pool: Any, driver: Any,
                      graph_name: str, on_problem: Callable[[str, list[str]], None], max_captures: int = 8,
                      check_syncs: bool = True) -> tuple[Program, list[CaptureInfo]]:
    """The graph's step: its runs between cuts captured as CUDA graphs, the cuts between them.
    Returns the step and one :class:`CaptureInfo` per graph, for explain(). ``on_problem(text,
    partition names)`` hears that a run cannot be captured as planned."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    static = {placeholders[i] for i in static_indices if 0 <= i < len(placeholders)}
    owned: set[int] = set()
    from_graphs: set[fx.Node] = set()  # outputs of earlier captured runs: graph buffers at fixed addresses
    infos: list[CaptureInfo] = []
    units, fns = [], []
    runs = runs_of(modules, callables)
    for run in runs:
        units.append(run)
        if not run.captured:
            fns.append(run.callables[0])
            continue
        written = {m.inputs[pos] for m in run.modules for pos in m.mutated_inputs}
        in_place = [k for k, n in enumerate(run.inputs) if n in static or n in written]
        produced = [k for k, n in enumerate(run.inputs) if n in from_graphs and k not in in_place]
        name = f"{graph_name}_cuda_graph_{len(infos)}" if len(runs) > 1 else f"{graph_name}_cuda_graph"
        info = CaptureInfo(name=name, partitions=run.names)
        infos.append(info)
        fns.append(GraphRunner(run_program(gm, run), info, device=device, pool=pool, driver=driver,
                               in_place=in_place, produced=produced, owned=owned,
                               on_problem=lambda text, names=run.names: on_problem(text, names),
                               max_captures=max_captures, check_syncs=check_syncs))
        from_graphs.update(run.outputs)
    return CopyOut(_assemble(gm, units, fns), owned), infos


def _assemble(gm: fx.GraphModule, runs: Sequence[Run], fns: Sequence[Program]) -> fx.GraphModule:
    """The top-level step: the graph's placeholders, one call per run, the graph's output."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    for run, fn in zip(runs, fns):
        call = graph.call_function(fn, tuple(env[n] for n in run.inputs))
        for k, out in enumerate(run.outputs):
            env[out] = graph.call_function(operator.getitem, (call, k))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph.node_copy(output, lambda n: env[n])
    return fx.GraphModule(gm, graph, class_name="SuperKernelCudaStep")


__all__ = ["CopyOut", "Run", "build_step_graphs", "run_program", "runs_of"]
