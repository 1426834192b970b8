"""max-autotune on CPU: a decode-sized W4A8 linear (the ``w4a8`` row of :mod:`superkernel.runtime.quant_schemes`) as
superkernel's integer kernel, ``torch.ops.superkernel.int4_int8_gemv``.

torchao's ``Int8DynamicActivationIntxWeightConfig`` (int4 weights held one per int8) computes in float: it quantizes
the activation per token and dequantizes it again, dequantizes the weight group by group, and calls a float32 GEMM:

    mm(view((float(xq) - float(zx)) * sx), permute(view((float(view(wq)) - float(view(zw))) * view(sw), [N, K])))

so the whole weight is widened to float32 every step. Where this CPU has the kernel's AVX2 path, such an ``mm`` of at
most :data:`~superkernel.runtime.inductor.quant_gemv.MAX_ROWS` rows becomes the kernel on ``xq, wq`` and the scales
and zeros: exact integer dot products per group, float32 across groups (the result differs from torchao's float GEMM
in the last bits: max-autotune's tolerance). reduce-overhead keeps torchao's graph (eager's bits).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from superkernel.runtime.inductor.quant_gemv import KERNEL, MAX_ROWS, _call, _fake_mode, _val

aten, prims = torch.ops.aten, torch.ops.prims
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _below_views(node: object) -> object:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node


def _float(node: object) -> fx.Node | None:
    """``t`` (below views) when ``node`` is ``float32(t)`` of an int8 ``t``; else None."""
    if not (_call(node, prims.convert_element_type.default) and node.args[1] == torch.float32):
        return None
    t = _below_views(node.args[0])
    return t if _val(t) is not None and _val(t).dtype == torch.int8 else None


def _dequantized(node: object) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """``(q, zero, scale)`` (below views) when ``node`` is ``(float(q) - float(zero)) * scale``; else None."""
    node = _below_views(node)
    if not _call(node, aten.mul.Tensor):
        return None
    sub, scale = node.args
    if _call(scale, aten.sub.Tensor):
        sub, scale = scale, sub
    if not _call(sub, aten.sub.Tensor):
        return None
    q, zero = _float(sub.args[0]), _float(sub.args[1])
    scale = _below_views(scale)
    if q is None or zero is None or _val(scale) is None or _val(scale).dtype != torch.float32:
        return None
    return q, zero, scale


def _operands(node: fx.Node) -> tuple[tuple, tuple, int] | None:
    """The activation's and the weight's ``(q, zero, scale)`` and the group size of a W4A8 ``mm`` (or ``addmm``'s
    product); else None."""
    a, b = node.args[-2:]
    if not (_call(b, aten.permute.default) and list(b.args[1]) == [1, 0]):
        return None
    grouped = _below_views(b.args[0])
    x, w = _dequantized(a), _dequantized(grouped)
    if x is None or w is None:
        return None
    shape = _val(grouped).shape if _val(grouped) is not None else None  # [N, K / G, G]: the group size
    xv, wv, sv, av = _val(x[0]), _val(w[0]), _val(w[2]), _val(a)
    if shape is None or len(shape) != 3 or av is None or av.dim() != 2 or wv.dim() != 2 or xv.numel() != av.numel() \
            or not xv.is_contiguous():
        return None
    group = int(shape[2])
    m, k, n = av.shape[0], av.shape[1], wv.shape[0]
    if wv.shape[1] != k or group % 32 or k % group or m > MAX_ROWS or sv.numel() != n * (k // group) \
            or _val(x[2]).numel() != m or _val(x[1]).numel() != m or _val(w[1]).numel() != sv.numel():
        return None
    return x, w, group


def rewrite_w4a8(gm: fx.GraphModule, scheme: object) -> list[str]:
    """Every decode-sized float32 W4A8 ``mm`` of ``gm`` (``addmm``: a linear with a bias, the bias added after) as
    the row's kernel, where it has a vector path here."""
    from superkernel.runtime.cpu import quant_kernels

    done: list[str] = []
    op = scheme.kernels[0].op
    for node in list(gm.graph.nodes):
        bias = node.args[0] if _call(node, aten.addmm.default) and not node.kwargs else None
        if not (_call(node, aten.mm.default) or bias is not None) or _val(node) is None \
                or _val(node).dtype != torch.float32:
            continue
        found = _operands(node)
        if found is None or not quant_kernels.fast_path(op):
            continue
        (xq, xz, xs), (wq, wz, ws), group = found
        rows = list(_val(node.args[-2]).shape)  # [M, K]
        out = _val(node)
        with gm.graph.inserting_before(node):
            x2 = gm.graph.call_function(aten.view.default, (xq, rows))
            call = gm.graph.call_function(getattr(torch.ops.superkernel, op).default, (x2, wq, group, xs, xz, ws, wz))
            new = [x2, call]
            if bias is not None:
                new.append(gm.graph.call_function(aten.add.Tensor, (call, bias)))
        with _fake_mode(out):
            x2.meta["val"] = torch.empty(rows, dtype=torch.int8, device=out.device)
            for result in new[1:]:
                result.meta["val"] = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        for new_node in new:
            new_node.meta.update({key: v for key, v in node.meta.items() if key not in ("val", "tensor_meta")})
        node.replace_all_uses_with(new[-1])
        gm.graph.erase_node(node)
        done.append(f"{scheme.report_name} GEMV {tuple(rows)} x {tuple(_val(wq).shape)}^T (groups of "
                    f"{group}){' + bias' if bias is not None else ''} as {KERNEL.replace('int8', 'int4 x int8')}")
    return done


__all__ = ["rewrite_w4a8"]
