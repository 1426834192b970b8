"""MoE expert GEMMs grouped: found and reported, not built.

Pattern (ATen)::

    w_e = select(W, 0, e)  /  index(W, [e])        (W: the experts' weights as one 3-D tensor)
    y_e = mm(x_e, permute(w_e, [1, 0]))            (or bmm / _grouped_mm on W)

What is there already: transformers (5.x) stores an MoE block's experts as 3-D weights with each
expert's gate and up projections already concatenated (``gate_up_proj``), and its expert loop depends
on the routing (which experts the tokens picked: ``nonzero``/``where``), so the experts' GEMMs are
already one GEMM per expert and the loop is not a static set of GEMMs a graph rewrite can group.
Grouping the picked experts into one call needs a grouped GEMM over routed rows, which Inductor does
not generate on CPU. The rule records where the expert GEMMs are.
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
NAME = "moe_experts"
WHY = ("experts are 3-D weights with gate/up already concatenated; which experts run depends on the routing, so "
       "grouping them needs a grouped GEMM over routed rows, which Inductor does not generate on CPU")
_GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default}
_PASS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.permute.default,
         aten.t.default, aten.transpose.int, aten.select.int, aten.index.Tensor, aten.expand.default,
         aten.unsqueeze.default, aten.clone.default}


def _from_3d_weight(node: object, limit: int = 8) -> bool:
    for _ in range(limit):
        if not isinstance(node, fx.Node):
            return False
        val = node.meta.get("val")
        if node.op in ("get_attr", "placeholder"):
            return isinstance(val, torch.Tensor) and val.dim() == 3
        if node.op != "call_function" or node.target not in _PASS:
            return False
        node = node.args[0]
    return False


def expert_gemms(gm: fx.GraphModule) -> list[str]:
    """The GEMMs whose weight operand is (a slice of) a 3-D weight, or grouped GEMMs."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if "grouped_mm" in str(node.target):
            out.append(node.name)
        elif node.target in _GEMMS and any(_from_3d_weight(a) for a in node.args[-2:]):
            out.append(node.name)
    return out
