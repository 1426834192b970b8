"""Attention forms that no rule fuses, found by a scan of what is left after fusing, so the
report names them (a near miss with the reason) instead of staying silent.

- **Disentangled attention** (DeBERTa v2/v3): the scores add content-to-position and
  position-to-content terms, each a product of Q or K with projected relative-position
  embeddings, gathered by relative distance (``GatherElements``). No com.microsoft contrib op
  computes these terms (``Attention`` / ``MultiHeadAttention`` take only a precomputed
  additive ``attention_bias``), and the exported mask is a ``Where`` (masked_fill) rather than
  an additive bias, so the softmax cannot be handed to a fused kernel as it stands.
"""

from __future__ import annotations

import onnx_ir as ir

_THROUGH = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Expand", "Reshape", "Transpose", "Clip", "Sqrt"}
DEPTH = 8

DISENTANGLED = ("disentangled (DeBERTa) attention: the scores add content-to-position / position-to-content "
                "terms gathered by relative distance (GatherElements over Q or K times the relative-position "
                "projections); no com.microsoft op computes them (Attention / MultiHeadAttention take only an "
                "additive attention_bias) and the mask is a masked_fill (Where), so the softmax stays unfused")


def _upstream(v: ir.Value | None, depth: int, seen: set) -> list[ir.Node]:
    """Producers reachable from ``v`` through element-wise / layout ops, ``depth`` steps."""
    out: list[ir.Node] = []
    frontier = [(v, 0)]
    while frontier:
        x, d = frontier.pop()
        if x is None or d > depth:
            continue
        p = x.producer()
        if p is None or p in seen:
            continue
        seen.add(p)
        out.append(p)
        if p.op_type in _THROUGH and p.domain in ("", "ai.onnx"):
            frontier.extend((i, d + 1) for i in p.inputs)
    return out


def disentangled_softmaxes(graph: ir.Graph) -> list[ir.Node]:
    """Softmax nodes whose scores include a GatherElements of a MatMul product (DeBERTa)."""
    found = []
    for n in graph:
        if n.op_type != "Softmax" or n.domain not in ("", "ai.onnx"):
            continue
        ups = _upstream(n.inputs[0], DEPTH, set())
        gathers = [u for u in ups if u.op_type == "GatherElements"]
        if any(g.inputs[0] is not None and g.inputs[0].producer() is not None
               and g.inputs[0].producer().op_type == "MatMul" for g in gathers) and \
                any(u.op_type == "MatMul" for u in ups):
            found.append(n)
    return found


def near_misses(graph: ir.Graph) -> list[tuple[ir.Node, str]]:
    """(node, reason) for every unfusable attention form in ``graph``."""
    return [(n, DISENTANGLED) for n in disentangled_softmaxes(graph)]
