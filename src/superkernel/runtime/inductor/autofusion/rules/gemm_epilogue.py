"""GEMM -> residual add (-> norm) epilogues and norm -> GEMM prologues: found and reported, not built.

Pattern::

    y = mm(a, W^T) ; r = add(x, view(y))          (epilogue: the residual add after o_proj / down_proj)
    n = mul(x, rsqrt(mean(pow(x, 2)) + eps)) ; mm(view(n * w), W^T)   (prologue: RMSNorm before q/k/v, gate/up)

What TorchInductor's CPU backend does with them by itself (torch 2.13,
``torch/_inductor/codegen/cpp.py``, ``CppScheduling.can_fuse_vertical``):

* a pointwise epilogue (the residual add, an activation) is fused into the GEMM when Inductor's
  C++ GEMM template wins its autotuning (``max_autotune_gemm``, on with frozen weights): nothing
  for a rule to add;
* when ATen/MKL wins (``_mkl_linear``, usual at decode shapes), the GEMM is an extern call and
  nothing is fused into it — only a hand-written kernel could, which this project does not write;
* a reduction (the norm after the add) is never fused into a GEMM epilogue
  (``not node2.is_reduction()``), and a prologue never (``if node2.is_template(): return False``;
  ``codegen_template`` asserts no prologue nodes): Inductor cannot generate these fusions on CPU.

So the rule records each chain as "not built" with that reason, so explain() shows where it is.
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
NAME = "gemm_epilogue_prologue"
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_GEMMS = {aten.mm.default, aten.addmm.default}

EPILOGUE_WHY = ("Inductor fuses a pointwise epilogue (this add) into its C++ GEMM template itself when the template "
                "wins autotuning; with ATen/MKL chosen nothing is fused into the GEMM, and a following norm "
                "(a reduction) never is on CPU (cpp.py can_fuse_vertical)")
PROLOGUE_WHY = ("Inductor's CPU backend cannot fuse a prologue (this norm) into a GEMM (cpp.py can_fuse_vertical "
                "returns False for a template consumer; codegen_template asserts no prologue)")


def _through_views(node: fx.Node) -> list[fx.Node]:
    out, todo = [], list(node.users)
    while todo:
        n = todo.pop()
        if n.op == "call_function" and n.target in _VIEWS:
            todo.extend(n.users)
        else:
            out.append(n)
    return out


def _is_rms_norm(node: fx.Node) -> bool:
    """``x * rsqrt(...)`` (optionally times a weight) with a mean in the rsqrt's input: an RMSNorm/LayerNorm tail."""
    seen, todo = 0, [node]
    while todo and seen < 8:
        n = todo.pop()
        seen += 1
        if not isinstance(n, fx.Node) or n.op != "call_function":
            continue
        if n.target is aten.rsqrt.default:
            return True
        if n.target in (aten.mul.Tensor, aten.add.Tensor, aten.add.Scalar, aten.mean.dim):
            todo.extend(a for a in n.args if isinstance(a, fx.Node))
    return False


def chains(gm: fx.GraphModule) -> tuple[list[str], list[str]]:
    """(epilogue chains "mm -> add", prologue chains "norm -> mm") of the graph."""
    epilogues, prologues = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _GEMMS:
            continue
        adds = [u for u in _through_views(node) if u.target is aten.add.Tensor]
        epilogues += [f"{node.name}->{a.name}" for a in adds]
        act = node.args[0] if node.target is aten.mm.default else node.args[1]
        while isinstance(act, fx.Node) and act.op == "call_function" and act.target in _VIEWS:
            act = act.args[0]
        if isinstance(act, fx.Node) and _is_rms_norm(act):
            prologues.append(f"{act.name}->{node.name}")
    return epilogues, prologues
