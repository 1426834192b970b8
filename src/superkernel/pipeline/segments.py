"""Cut the scopes of a captured ATen graph into segments.

Operators are visited in execution order. Consecutive operators of one scope form
a segment. An operator that cannot run inside a superkernel (data-dependent output
shape, host synchronization, user-registered, or a rule of the graph's realization such
as CPU work in a CUDA-graph scope) ends the current segment, runs alone, and is recorded
as a :class:`~superkernel.ir.graph.Cut`.
Operators of another scope or unscoped operators in between also end a segment.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.ir.graph import (
    Cut, Partition, ScopeOptions, Segmentation, SuperKernelScopeError, node_scope, tensor_values,
)

#: an extra reason an operator cannot run inside a segment (a realization's ``cut_reason``), or None
CutRule = Callable[[fx.Node], "str | None"]

# --- fusability rules -------------------------------------------------------------

_aten = torch.ops.aten

DATA_DEPENDENT_SHAPE = "data-dependent output shape"
HOST_SYNC = "host synchronization"
GRAPH_BREAK = "graph break (Dynamo split the model here; the scope continues in the next graph)"


def _packets(*names: str) -> set[Any]:
    out = set()
    for name in names:
        packet = getattr(_aten, name, None)
        if packet is not None:
            out.add(packet)
    return out


_DATA_DEPENDENT_OPS = _packets(
    "nonzero", "unique_dim", "unique_consecutive", "_unique", "_unique2", "masked_select",
    "argwhere", "repeat_interleave",
)
_HOST_SYNC_OPS = _packets("_local_scalar_dense", "item", "equal", "is_nonzero", "_assert_async")

_user_unfusable: dict[Any, str] = {}


def register_unfusable(op: Any, reason: str = "registered unfusable by the user") -> None:
    """Mark an operator as unable to run inside a superkernel: scopes are cut around it.

    ``op`` may be an OpOverload (``torch.ops.aten.cumsum.default``), an OpOverloadPacket
    (``torch.ops.aten.cumsum``, all overloads) or a name such as ``"aten::cumsum"``.
    """
    if not isinstance(op, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise TypeError(f"register_unfusable expects a torch op or a name like 'aten::cumsum', got {op!r}")
    if not isinstance(reason, str) or not reason:
        raise ValueError("register_unfusable needs a non-empty reason string")
    _user_unfusable[_unfusable_key(op)] = reason


def unregister_unfusable(op: Any) -> None:
    """Undo :func:`register_unfusable` (unknown ops are ignored)."""
    _user_unfusable.pop(_unfusable_key(op), None)


def _unfusable_key(op: Any) -> Any:
    """Ops register as themselves; names as ``"namespace::name"`` (``"cumsum"`` means ``"aten::cumsum"``)."""
    if isinstance(op, str):
        return op if "::" in op else f"aten::{op}"
    return op


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target.name()  # "aten::nonzero" + overload
    return getattr(target, "__name__", str(target))


def _packet(target: Any) -> Any:
    return getattr(target, "overloadpacket", target)


def _has_unbacked_symbols(val: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(val))
    except Exception:
        return False


def is_host_scalar(node: fx.Node) -> bool:
    """True for shape bookkeeping that launches no kernel: SymInt arithmetic,
    ``sym_size``, ``_assert_scalar`` on sizes. Such nodes join the partition they
    follow and never cut a scope."""
    if node.op != "call_function" or _packet(node.target) in _HOST_SYNC_OPS:
        return False
    val = node.meta.get("val")
    return not tensor_values(val) and not isinstance(val, (list, tuple))


def unfusable_reason(node: fx.Node, cut_rule: CutRule | None = None, *, user_rules: bool = True) -> str | None:
    """Why ``node`` cannot run inside a superkernel, or None when it can (``cut_rule``: the
    realization's own rule, asked last; ``user_rules=False``: leave out what the user registered,
    which is about fusing, not about whether a CUDA graph can hold the operator)."""
    if node.op != "call_function":
        return None
    target = node.target
    packet = _packet(target)
    for key in (target, packet, getattr(packet, "_qualified_op_name", None)) if user_rules else ():
        if key is not None and key in _user_unfusable:  # op, all overloads, "aten::name"
            return _user_unfusable[key]
    name = _op_name(target)
    if _packet(target) in _HOST_SYNC_OPS:
        return f"{HOST_SYNC}: {name} reads a device value on the host (.item() / assertion)"
    if _packet(target) is getattr(_aten, "histc", None) and _histc_range(node)[0] == _histc_range(node)[1]:
        return f"{HOST_SYNC}: {name} without a range (min == max) reads the data's minimum and maximum on the host"
    if _packet(target) in _DATA_DEPENDENT_OPS:
        return f"{DATA_DEPENDENT_SHAPE}: {name}'s output size depends on tensor values"
    if target is _aten.index.Tensor:
        indices = node.args[1] if len(node.args) > 1 else []
        for idx in indices or []:
            val = getattr(idx, "meta", {}).get("val") if isinstance(idx, fx.Node) else None
            if isinstance(val, torch.Tensor) and val.dtype == torch.bool:
                return f"{DATA_DEPENDENT_SHAPE}: boolean-mask indexing selects a value-dependent number of elements"
    val = node.meta.get("val")
    if val is not None and _has_unbacked_symbols(val):
        return f"{DATA_DEPENDENT_SHAPE}: {name} produces a shape only known at run time"
    return cut_rule(node) if cut_rule is not None else None


def _histc_range(node: fx.Node) -> tuple[Any, Any]:
    lo = node.kwargs.get("min", node.args[2] if len(node.args) > 2 else 0)
    hi = node.kwargs.get("max", node.args[3] if len(node.args) > 3 else 0)
    return lo, hi


# --- partitions ---------------------------------------------------------------------

_SOURCE_RE = re.compile(r'File "([^"]+)", line (\d+)')


def source_line(node: fx.Node) -> str | None:
    """``"file.py:LINE"`` of the innermost user frame recorded for the node."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = _SOURCE_RE.findall(trace)
    if not frames:
        return None
    path, line = frames[-1]
    return f"{path}:{line}"


def build_segments(
    gm: fx.GraphModule,
    *,
    continues_scope: str | None = None,
    break_reason: str | None = None,
    cut_rule: CutRule | None = None,
    split_unscoped: bool = False,
) -> Segmentation:
    """Partition ``gm``'s operators into segments, unscoped runs and cut operators.

    ``continues_scope``: the scope the previous graph ended in when Dynamo ended that graph
    with a graph break (``break_reason``); if this graph starts in the same scope, the
    break split the scope, which is recorded as a cut. ``cut_rule``: the graph's realization's extra
    rule (``Realization.cut_reason``; the backend passes its row's), e.g. no CPU work in a
    CUDA-graph segment. ``split_unscoped``: an unscoped operator a CUDA graph cannot hold (the same
    rules but the user's registry) also runs alone, as a ``"cut"`` partition outside every scope,
    recorded in :attr:`Segmentation.step_cuts` (the CUDA rows capture the whole step, glue included).
    ``strict-scope-check=abort`` raises :class:`SuperKernelScopeError`.
    """
    partitions: list[Partition] = []
    cuts: list[Cut] = []
    step_cuts: list[Cut] = []
    owner: dict[fx.Node, Partition] = {}
    current: Partition | None = None
    seen_first_op = False

    def record_cut(cut: Cut, options: ScopeOptions) -> None:
        if options.abort_on_cut:
            raise SuperKernelScopeError(
                f"strict-scope-check=abort: scope {cut.scope!r} cannot be fused at {cut.op}"
                f"{' (' + cut.source + ')' if cut.source else ''}: {cut.reason}",
                cut,
            )
        cuts.append(cut)

    for index, node in enumerate(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0] in owner:
            part = owner[node.args[0]]
            part.nodes.append(node)
            part.indices.append(index)
            owner[node] = part
            continue
        if current is not None and is_host_scalar(node):
            current.nodes.append(node)
            current.indices.append(index)
            owner[node] = current
            continue
        scope, options = node_scope(node)
        if not seen_first_op:
            seen_first_op = True
            if scope and continues_scope == scope:
                reason = GRAPH_BREAK + (f": {break_reason}" if break_reason else "")
                record_cut(Cut(scope, index, _op_name(node.target), reason, source_line(node)), options)
        if scope:
            reason = unfusable_reason(node, cut_rule)
        else:
            reason = unfusable_reason(node, cut_rule, user_rules=False) if split_unscoped else None
        if reason is not None:
            cut = Cut(scope, index, _op_name(node.target), reason, source_line(node))
            if scope:
                record_cut(cut, options)
            else:
                step_cuts.append(cut)
            current = Partition("cut", scope, options, [node], [index])
            partitions.append(current)
            owner[node] = current
            continue
        kind = "segment" if scope else "unscoped"
        if current is None or current.kind != kind or current.scope != scope:
            # (a "cut" partition never continues: the next fusable op starts a new one)
            current = Partition(kind, scope, options)
            partitions.append(current)
        current.nodes.append(node)
        current.indices.append(index)
        owner[node] = current

    _name_partitions(partitions)
    return Segmentation(partitions, cuts, step_cuts)


def _name_partitions(partitions: list[Partition]) -> None:
    """Segments of a scope that was cut (or appears more than once) are named
    ``<scope>_split_<first>_<last>``; a scope realized whole keeps its plain name."""
    per_scope: dict[str, int] = {}
    for p in partitions:
        if p.kind == "segment":
            per_scope[p.scope] = per_scope.get(p.scope, 0) + 1
        elif p.kind == "cut":
            per_scope[p.scope] = per_scope.get(p.scope, 0) + 2  # a cut scope always gets split names
    for p in partitions:
        if p.kind == "segment":
            p.name = p.scope if per_scope[p.scope] == 1 else f"{p.scope}_split_{p.first}_{p.last}"
        elif p.kind == "cut":
            p.name = f"{p.scope}_cut_{p.first}" if p.scope else f"step_cut_{p.first}"
        else:
            p.name = f"unscoped_{p.first}_{p.last}"


def last_scope(gm: fx.GraphModule) -> str:
    """Scope of the last operator of the graph ("" when unscoped)."""
    for node in reversed(gm.graph.nodes):
        if node.op == "call_function" and node.target is not operator.getitem:
            return node_scope(node)[0]
    return ""
