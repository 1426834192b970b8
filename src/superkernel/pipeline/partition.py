"""Turn partitions of an ATen graph into standalone GraphModules and stitch them back.

:func:`split_partitions` gives every partition its own GraphModule whose placeholders
are the values it reads from outside and whose output is a tuple of the values used
after it. :func:`assemble` builds the top-level GraphModule that calls one realized
callable per partition, in order, so the whole step is straight-line generated code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import operator

import torch.fx as fx

from superkernel.ir.graph import Partition


@dataclass
class PartitionModule:
    partition: Partition
    gm: fx.GraphModule
    inputs: list[fx.Node]  # parent-graph nodes it reads
    outputs: list[fx.Node]  # parent-graph nodes it defines and that are used after it

    @property
    def example_inputs(self) -> list[Any]:
        """FakeTensors (or SymInts) of the inputs, from the parent graph's metadata."""
        return [n.meta.get("val") for n in self.inputs]

    @property
    def mutated_inputs(self) -> list[int]:
        """Positions of inputs written in place by the partition (e.g. a KV cache)."""
        mutated = []
        for i, ph in enumerate(n for n in self.gm.graph.nodes if n.op == "placeholder"):
            for user in ph.users:
                schema = getattr(user.target, "_schema", None)
                if schema is None:
                    continue
                for arg, value in zip(schema.arguments, user.args):
                    if value is ph and arg.alias_info is not None and arg.alias_info.is_write:
                        mutated.append(i)
                        break
                else:
                    continue
                break
        return mutated


def split_partitions(gm: fx.GraphModule, partitions: list[Partition]) -> list[PartitionModule]:
    owner: dict[fx.Node, int] = {}
    for i, part in enumerate(partitions):
        for node in part.nodes:
            owner[node] = i
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")

    modules = []
    for i, part in enumerate(partitions):
        members = set(part.nodes)
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        inputs: list[fx.Node] = []

        def lookup(node: fx.Node) -> fx.Node:
            if node in env:
                return env[node]
            if node in members:
                raise AssertionError(f"partition {part.name}: node {node} used before it is defined")
            placeholder = graph.placeholder(node.name)
            placeholder.meta = dict(node.meta)
            env[node] = placeholder
            inputs.append(node)
            return placeholder

        for node in part.nodes:
            for dep in node.all_input_nodes:
                lookup(dep)
            env[node] = graph.node_copy(node, lambda n: env[n])
        outputs = [
            n for n in part.nodes
            if any(u is output_node or owner.get(u, i) != i for u in n.users)
        ]
        graph.output(tuple(env[n] for n in outputs))
        sub = fx.GraphModule(gm, graph, class_name=f"Partition_{part.name}")
        modules.append(PartitionModule(part, sub, inputs, outputs))
    return modules


def assemble(gm: fx.GraphModule, modules: list[PartitionModule], callables: list[Callable[..., Any]]) -> fx.GraphModule:
    """Top-level GraphModule: placeholders, then one call per partition, then the output."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    for module, fn in zip(modules, callables):
        call = graph.call_function(fn, tuple(env[n] for n in module.inputs))
        for k, out in enumerate(module.outputs):
            env[out] = graph.call_function(operator.getitem, (call, k))
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph.node_copy(output_node, lambda n: env[n])
    return fx.GraphModule(gm, graph, class_name="SuperKernelStep")


def named_callable(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A plain function with a readable ``__name__`` (fx codegen names globals after it)."""

    def call(*args: Any) -> Any:
        return fn(*args)

    safe = "".join(c if c.isalnum() else "_" for c in name)
    call.__name__ = call.__qualname__ = f"sk_{safe}"
    return call


__all__ = ["PartitionModule", "split_partitions", "assemble", "named_callable"]
