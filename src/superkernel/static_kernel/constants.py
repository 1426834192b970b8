"""Tensors a partition reads as attributes (weights): lifted to inputs, never packaged.

A standalone artifact compiled with tensor attributes expects them as arguments when it
is loaded; lifting makes that explicit, and the running process passes its own tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.static_kernel import compat
from superkernel.static_kernel.signature import fetch_attr


def materialize(value: Any) -> Any:
    """A real tensor with the (fake) tensor's size, stride, dtype and device; other values unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    with compat.unset_fake_mode():
        shape = [int(s) for s in value.shape]
        stride = [int(s) for s in value.stride()]
        offset = int(value.storage_offset())
        if offset == 0:
            out = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        else:
            span = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0)
            base = torch.empty(offset + span, dtype=value.dtype, device=value.device)
            out = base.as_strided(shape, stride, offset)
        if out.dtype.is_floating_point or out.dtype.is_complex:
            out.zero_()
        return out


def constant_values(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm`` reads as attributes, in graph order ([] unless every attribute is a tensor)."""
    values = [fetch_attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return []
    return [v.detach() for v in values]


def lift_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with its tensor get_attr nodes turned into trailing placeholders, matching
    :func:`constant_values`; ``gm`` itself when there are none."""
    if not constant_values(gm):
        return gm
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
        env[node] = graph.node_copy(node, lambda n: env[n])
    for i, node in enumerate(attrs):
        ph = graph.placeholder(f"_sk_const_{i}")
        ph.meta = dict(node.meta)
        env[node] = ph
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(torch.nn.Module(), graph, class_name=type(gm).__name__)


def with_constants(fn: Callable[..., Any], constants: list[torch.Tensor]) -> Callable[..., Any]:
    """``fn`` called with this call site's constants appended to its arguments."""
    if not constants:
        return fn

    def run(*args: Any) -> Any:
        return fn(*args, *constants)

    return run
