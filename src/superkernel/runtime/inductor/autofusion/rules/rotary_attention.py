"""Rotary embedding + attention into one SDPA call: found and reported, not built.

Pattern (ATen)::

    q' = add(mul(q, cos), mul(cat([neg(slice(q)), slice(q)]), sin))      (rotate_half rotary, same for k)
    o  = _scaled_dot_product_*attention*(q', k', v, ...)

What is there already: transformers' decoder layers call ``scaled_dot_product_attention``, so the
attention itself reaches the segment as one SDPA call; on CPU Inductor runs it as an ATen (extern)
call and fuses only the pointwise rotary ops with each other, never into the SDPA. Moving the
rotary into the attention call would need an attention kernel that applies it, which Inductor does
not generate and this project does not hand-write. The rule records where the chain is.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.fx as fx

aten = torch.ops.aten
NAME = "rotary_attention"
WHY = ("attention is already one SDPA call; Inductor runs it as an ATen call on CPU and fuses the rotary's pointwise "
       "ops only with each other: applying the rotary inside the SDPA needs an attention kernel Inductor does not "
       "generate (and this project does not hand-write)")
#: the search for the rotary stops at GEMMs (the projections that make q and k)
_STOP = {aten.mm.default, aten.addmm.default, aten.bmm.default}


def is_sdpa(node: fx.Node) -> bool:
    return node.op == "call_function" and "scaled_dot_product" in str(node.target)


def _has_rotary(start: object, limit: int = 48) -> bool:
    """Whether a ``neg`` (rotate_half) is among the nearest ops that feed ``start`` (breadth first, up to
    the GEMMs that make q and k)."""
    todo, seen = deque([start]), set()
    while todo and len(seen) < limit:
        n = todo.popleft()
        if not isinstance(n, fx.Node) or n in seen or n.op != "call_function" or n.target in _STOP:
            continue
        seen.add(n)
        if n.target is aten.neg.default:
            return True
        todo.extend(n.all_input_nodes)
    return False


def chains(gm: fx.GraphModule) -> tuple[list[str], list[str]]:
    """(``"rotary->sdpa"`` where a rotary reaches an SDPA's query or key, the SDPA calls without one)."""
    with_rotary, without = [], []
    for node in gm.graph.nodes:
        if not is_sdpa(node):
            continue
        if any(_has_rotary(a) for a in node.args[:2]):
            with_rotary.append(f"rotary->{node.name}")
        else:
            without.append(node.name)
    return with_rotary, without
