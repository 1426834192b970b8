"""Horizontal GEMM fusion: GEMMs that read the same input (Q/K/V projections, gate/up of a
SwiGLU MLP) become one GEMM against the concatenated weight, its output split by views.

Pattern (ATen, as Inductor's decompositions leave a ``Linear``)::

    a = view(x, [M, K])                       (the same x and shape for every GEMM)
    y_i = mm(a, permute(W_i, [1, 0]))         or addmm(b_i, a, permute(W_i, [1, 0]))

Rewrite::

    y = mm(a, permute(cat([W_1 .. W_n], 0), [1, 0]))      (addmm with cat([b_1 .. b_n]))
    y_i = slice(y, 1, off_i, off_i + N_i)

With frozen weights (``W_i`` are constants) Inductor's constant folding turns the ``cat`` into one
constant, which its freezing passes prepack like any linear weight: the rewrite costs nothing per
call. Inductor has the same idea (``torch._inductor.config.cpp.enable_concat_linear``, off by default
on CPU, all-or-nothing per graph, two or three GEMMs of one kind); this rule is applied per
candidate, only where the benefit model and a measurement at the real shapes agree.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

aten = torch.ops.aten
NAME = "horizontal_gemm"
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_TRANSPOSES = {aten.permute.default, aten.t.default}


@dataclass
class Gemm:
    node: fx.Node
    act: fx.Node
    weight: fx.Node            # W, [N, K] (the GEMM multiplies by its transpose)
    transpose: fx.Node         # the permute/t node
    bias: fx.Node | None


@dataclass
class Candidate:
    gemms: list[Gemm]
    m: int
    k: int
    ns: list[int]
    dtype: torch.dtype
    constant: bool             # every weight (and bias) is a constant of the graph

    @property
    def where(self) -> str:
        return "+".join(g.node.name for g in self.gemms)

    @property
    def shapes(self) -> str:
        return f"[{self.m}x{self.k}] @ [{self.k}x{'+'.join(map(str, self.ns))}] {str(self.dtype).replace('torch.', '')}"


def _val(node: object) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _base(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node


def _weight_of(b: object) -> tuple[fx.Node, fx.Node] | None:
    if not isinstance(b, fx.Node) or b.op != "call_function" or b.target not in _TRANSPOSES:
        return None
    if b.target is aten.permute.default and list(b.args[1]) != [1, 0]:
        return None
    w = b.args[0]
    v = _val(w)
    if not isinstance(w, fx.Node) or w.op not in ("get_attr", "placeholder") or v is None or v.dim() != 2:
        return None
    return w, b


def _gemm(node: fx.Node) -> Gemm | str:
    """The node as a linear GEMM, or why it is not one this rule takes."""
    if node.target is aten.mm.default:
        a, b, bias = node.args[0], node.args[1], None
    else:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return "addmm with beta/alpha"
        bias, a, b = node.args[:3]
        if not isinstance(bias, fx.Node) or bias.op not in ("get_attr", "placeholder") or \
                _val(bias) is None or _val(bias).dim() != 1:
            return "bias is not a 1-D weight"
    found = _weight_of(b)
    if found is None:
        return "second operand is not a transposed 2-D weight"
    if _val(a) is None or _val(a).dim() != 2:
        return "input is not 2-D"
    return Gemm(node, a, found[0], found[1], bias)


def match(gm: fx.GraphModule, is_constant: Callable[[fx.Node], bool]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """(candidates, [(where, why not) for every GEMM not in one])."""
    groups: dict[tuple, list[Gemm]] = defaultdict(list)
    misses: list[tuple[str, str]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        g = _gemm(node)
        if isinstance(g, str):
            misses.append((node.name, g))
            continue
        a, w = _val(g.act), _val(g.weight)
        key = (_base(g.act), tuple(a.shape), tuple(a.stride()), node.target, w.dtype, w.shape[1])
        groups[key].append(g)
    candidates = []
    for (_, shape, _, _, dtype, k), gemms in groups.items():
        if len(gemms) < 2:
            misses.append((gemms[0].node.name, f"no other GEMM reads {_base(gemms[0].act).name} as [{shape[0]}x{k}]"))
            continue
        constant = all(is_constant(g.weight) and (g.bias is None or is_constant(g.bias)) for g in gemms)
        candidates.append(Candidate(gemms, int(shape[0]), int(k), [int(_val(g.weight).shape[0]) for g in gemms],
                                    dtype, constant))
    return candidates, misses


def apply(gm: fx.GraphModule, cand: Candidate) -> None:
    """Rewrite the candidate's GEMMs into one (see the module doc); ``gm`` is recompiled."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    gemms = sorted(cand.gemms, key=lambda g: order[g.node])
    first = gemms[0]
    for g in gemms:  # constants defined after the first GEMM move up to it (a get_attr has no inputs)
        for operand in (g.weight, g.bias):
            if operand is not None and operand.op == "get_attr" and order[operand] > order[first.node]:
                first.node.prepend(operand)
    with graph.inserting_before(first.node):
        wcat = graph.call_function(aten.cat.default, ([g.weight for g in gemms], 0))
        wt = graph.call_function(aten.permute.default, (wcat, [1, 0]))
        if first.bias is None:
            fused = graph.call_function(aten.mm.default, (first.act, wt))
        else:
            bcat = graph.call_function(aten.cat.default, ([g.bias for g in gemms], 0))
            fused = graph.call_function(aten.addmm.default, (bcat, first.act, wt))
        start = 0
        for g in gemms:
            n = int(_val(g.weight).shape[0])
            part = graph.call_function(aten.slice.Tensor, (fused, 1, start, start + n))
            start += n
            g.node.replace_all_uses_with(part)
    for g in gemms:
        graph.erase_node(g.node)
        if not g.transpose.users:
            graph.erase_node(g.transpose)
    _fake_meta(graph, [wcat, wt, fused, *(n for n in fused.users)] + ([bcat] if first.bias is not None else []))
    gm.recompile()


def _fake_meta(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """``meta['val']`` of the new nodes, computed on their inputs' fake values (later passes read it)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in sorted(set(nodes), key=order.__getitem__):
        args = fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
        try:
            node.meta["val"] = node.target(*args)
        except Exception:  # noqa: BLE001 - Inductor's passes propagate fake values again
            pass
