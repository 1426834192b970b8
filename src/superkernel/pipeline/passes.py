"""Graph passes applied to the captured ATen graph before segmentation.

:func:`reinplace_input_updates` undoes the copies functionalization adds around an
in-place update of a graph input. A decode step writes the new key/value into the
preallocated KV cache with ``index_copy_``; the captured graph instead holds
``new = index_copy(cache, ...)`` (a copy of the whole cache) and, at the end,
``cache.copy_(new)`` (a second one). Writing in place computes the same values with
no full-cache copies, so results stay bit-identical.
"""

from __future__ import annotations

import torch
import torch.fx as fx


def _inplace_variant(target: object) -> object | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None
    packet = getattr(torch.ops.aten, target.overloadpacket.__name__ + "_", None)
    if packet is None:
        return None
    overload = getattr(packet, target._overloadname, None)
    return overload


def reinplace_input_updates(gm: fx.GraphModule) -> int:
    """Rewrite ``v = op(P, ...); ...; P.copy_(v)`` into ``op_(P, ...)``; returns how many.

    Applied only where it is safe without alias analysis: ``P`` is a graph input whose
    only users are the functional op and the final ``copy_``.
    """
    rewritten = 0
    for copy in list(gm.graph.nodes):
        if copy.op != "call_function" or copy.target is not torch.ops.aten.copy_.default or copy.users:
            continue
        dest, value = copy.args[0], copy.args[1]
        if not (isinstance(dest, fx.Node) and dest.op == "placeholder" and isinstance(value, fx.Node)):
            continue
        if value.op != "call_function" or not value.args or value.args[0] is not dest:
            continue
        if set(dest.users) != {value, copy}:
            continue
        inplace = _inplace_variant(value.target)
        if inplace is None:
            continue
        dest_val, value_val = dest.meta.get("val"), value.meta.get("val")
        if not (isinstance(dest_val, torch.Tensor) and isinstance(value_val, torch.Tensor)):
            continue
        if dest_val.shape != value_val.shape or dest_val.dtype != value_val.dtype or dest_val.stride() != value_val.stride():
            continue
        value.target = inplace
        gm.graph.erase_node(copy)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
