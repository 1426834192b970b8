"""max-autotune on CPU: a quantized decode GEMV (int8 weight-only, W8A8, int4 weight-only) reads its weights once.

A weight-only int8 linear (torchao's ``Int8WeightOnlyConfig``) reaches Inductor as
``mm(x, convert_element_type(permute(w_int8), float32)) * scale``: Inductor materializes the whole weight
in float32 and calls an external GEMM on it, so the GEMV reads the weights five times over (int8 in,
float32 out, float32 in again) and is slower than the float model (issue 37: 7.99 ms against 3.82 ms for
the float32 MLP). Inductor's own weight-only pattern (``_weight_int8pack_mm``) fires for bfloat16
activations only, and ATen's float32 ``_weight_int8pack_mm`` is a reference loop (11.6 ms for one
4864x896 GEMV here, against 1.0 ms for the float32 GEMV).

For a decode-sized left operand (at most :data:`MAX_ROWS` rows) this pass rewrites the ``mm`` as a call of
superkernel's own int8 kernel (:mod:`superkernel.runtime.cpu.quant_kernels`, where the CPU has AVX-512 or AVX2:
20-24 GB/s of int8 in a step with AVX-512, against 13-14 GB/s for the reduction below), else as a reduction,
``sum(x[:, None, :] * float(w_int8), -1)``, which Inductor's C++ backend emits as one vectorized loop that
loads int8, converts and accumulates in float32. ``x`` is materialized first
(``prims.inductor_force_stride_order``): left to Inductor, the pointwise work that produces it (a norm's
scaling before the head) is fused into the loop and recomputed for every output row — 22.8 ms instead of
7.8 ms for Qwen2-0.5B's 151936-row head, measured. With it: 0.27 ms for the 4864x896 GEMV
above, 3.8x faster than the float32 GEMV, float32 accumulation (the result differs from the float GEMM in
the last bits only: max-autotune's tolerance). Measured at the real shapes of a Qwen2-0.5B step by
``benchmarks/quant_gemv.py``. bfloat16 activations are left to Inductor's pattern (ATen's bfloat16
``_weight_int8pack_mm`` is faster than any reduction there).
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten, prims = torch.ops.aten, torch.ops.prims

#: rewrite only GEMVs of decode size: a left operand of at most this many rows
MAX_ROWS = 8
#: how a rewrite computes the GEMV (explain's line)
KERNEL, REDUCTION = "superkernel's int8 kernel", "a reduction reading int8"
INT4_KERNEL = "superkernel's int4 kernel"
#: Inductor's C++ backend sums a float reduction longer than 4096 through a cascade helper (for accuracy), about
#: twice as slow here (896x4864: 1.3 ms against 0.62 ms for the float GEMV); a longer K is summed in chunks
#: of at most this many elements, then over the chunks
MAX_CHUNK = 4096


def _chunks(k: int) -> int:
    """The fewest chunks of equal length <= MAX_CHUNK (a multiple of 16 where one exists) that split ``k``."""
    for n in range(1, k + 1):
        if k % n == 0 and k // n <= MAX_CHUNK and (k // n) % 16 == 0:
            return n
    return next(n for n in range(1, k + 1) if k % n == 0 and k // n <= MAX_CHUNK)


def _val(node: object) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _int8_weight(b: fx.Node) -> fx.Node | None:
    """The int8 ``[N, K]`` weight behind ``b`` when ``b`` is its float32 transpose (convert(permute(w)) or
    permute(convert(w))); else None."""
    if not isinstance(b, fx.Node) or b.op != "call_function":
        return None
    if b.target is prims.convert_element_type.default and b.args[1] == torch.float32:
        inner = b.args[0]
        if isinstance(inner, fx.Node) and inner.target is aten.permute.default and list(inner.args[1]) == [1, 0]:
            w = inner.args[0]
            return w if _val(w) is not None and _val(w).dtype == torch.int8 and _val(w).dim() == 2 else None
        return None
    if b.target is aten.permute.default and list(b.args[1]) == [1, 0]:
        inner = b.args[0]
        if isinstance(inner, fx.Node) and inner.target is prims.convert_element_type.default \
                and inner.args[1] == torch.float32:
            w = inner.args[0]
            return w if _val(w) is not None and _val(w).dtype == torch.int8 and _val(w).dim() == 2 else None
    return None


def _materialized() -> object:
    """Inductor's ``prims.inductor_force_stride_order``: its lowering realizes the input as a buffer of its own."""
    import torch._inductor.inductor_prims  # noqa: F401 - registers the prims

    return torch.ops.prims.inductor_force_stride_order.default


def _reduction(graph: fx.Graph, before: fx.Node, a: fx.Node, x: torch.Tensor, w: fx.Node, wv: torch.Tensor,
               fake_mode: object, meta: dict) -> fx.Node:
    """Insert, before ``before``, ``sum(a[:, None, :] * float(w), -1)`` (``a``: float32 ``[M, K]`` with value ``x``,
    ``w``: the int8 ``[N, K]`` weight), summed in chunks over a long K; returns the float32 ``[M, N]`` node."""
    rows, n, k = x.shape[0], wv.shape[0], x.shape[1]
    chunks = _chunks(k)
    with graph.inserting_before(before):
        wf = graph.call_function(prims.convert_element_type.default, (w, torch.float32))
        xr = graph.call_function(_materialized(), (a, list(x.stride())))
        xs = graph.call_function(aten.unsqueeze.default, (xr, 1))
        prod = graph.call_function(aten.mul.Tensor, (xs, wf))
        if chunks == 1:
            out = graph.call_function(aten.sum.dim_IntList, (prod, [2]))
            extra = []
        else:
            split = graph.call_function(aten.view.default, (prod, [rows, n, chunks, k // chunks]))
            partial = graph.call_function(aten.sum.dim_IntList, (split, [3]))
            out = graph.call_function(aten.sum.dim_IntList, (partial, [2]))
            extra = [split, partial]
    with fake_mode:
        xr.meta["val"] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        wf.meta["val"] = torch.empty(wv.shape, dtype=torch.float32, device=wv.device)
        xs.meta["val"] = torch.empty((rows, 1, k), dtype=torch.float32, device=x.device)
        prod.meta["val"] = torch.empty((rows, n, k), dtype=torch.float32, device=x.device)
        out.meta["val"] = torch.empty((rows, n), dtype=torch.float32, device=x.device)
        if extra:
            extra[0].meta["val"] = torch.empty((rows, n, chunks, k // chunks), dtype=torch.float32, device=x.device)
            extra[1].meta["val"] = torch.empty((rows, n, chunks), dtype=torch.float32, device=x.device)
    for new in (wf, xr, xs, prod, *extra, out):
        new.meta.update({key: v for key, v in meta.items() if key not in ("val", "tensor_meta")})
    return out


def _fake_mode(*values: torch.Tensor) -> object:
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(values)) or torch._subclasses.fake_tensor.FakeTensorMode()


def _kernel_call(graph: fx.Graph, before: fx.Node, op: str, a: fx.Node, w: fx.Node, x: torch.Tensor,
                 wv: torch.Tensor, fake_mode: object, meta: dict) -> fx.Node | None:
    """Insert, before ``before``, a call of our kernel ``torch.ops.superkernel.<op>(a, w)`` (module
    :mod:`superkernel.runtime.cpu.quant_kernels`; ``x``, ``wv``: the values of ``a`` and ``w``) giving the ``[M, N]``
    result (int32 for the W8A8 dot); None (nothing inserted) where the weight is not contiguous or the kernel
    has no vector path on this CPU or cannot be built: the caller writes the reduction instead."""
    from superkernel.runtime import quant_schemes
    from superkernel.runtime.cpu import quant_kernels

    if not wv.is_contiguous() or not quant_kernels.fast_path(op):
        return None
    with graph.inserting_before(before):
        call = graph.call_function(getattr(torch.ops.superkernel, op).default, (a, w))
    with fake_mode:
        dtype = getattr(torch, quant_schemes.kernel(op).out_dtype)
        call.meta["val"] = torch.empty((x.shape[0], wv.shape[0]), dtype=dtype, device=x.device)
    call.meta.update({key: v for key, v in meta.items() if key not in ("val", "tensor_meta")})
    return call


def rewrite_quantized_gemv(gm: fx.GraphModule) -> list[str]:
    """Rewrite ``gm``'s decode-sized quantized GEMVs, each scheme of the table
    (:data:`superkernel.runtime.quant_schemes.SCHEMES`) by its row's rewrite; one line per rewrite (for explain)."""
    from superkernel.runtime.quant_schemes import SCHEMES

    done: list[str] = []
    for row in SCHEMES.values():
        done += row.rewriter()(gm, row)
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def rewrite_int8_weight(gm: fx.GraphModule, scheme: object) -> list[str]:
    """Every decode-sized float32 x int8-weight ``mm`` of ``gm`` as our kernel or a reduction (see module doc)."""
    done: list[str] = []
    fake_mode = None
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
        a, b = node.args
        x, w = _val(a), _int8_weight(b)
        if x is None or w is None or x.dtype != torch.float32 or x.dim() != 2 or x.shape[0] > MAX_ROWS:
            continue
        wv = _val(w)
        fake_mode = fake_mode or _fake_mode(x, wv)
        out = _kernel_call(gm.graph, node, scheme.kernels[0].op, a, w, x, wv, fake_mode, node.meta)
        how = KERNEL if out is not None else REDUCTION
        if out is None:
            out = _reduction(gm.graph, node, a, x, w, wv, fake_mode, node.meta)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        done.append(f"{scheme.report_name} GEMV {tuple(x.shape)} x {tuple(wv.shape)}^T as {how}")
    return done


def _call(node: object, target: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is target


def _int8_activation(u: object) -> fx.Node | None:
    """``X`` when ``u`` is ``uint8(int32(X) + 128)`` with ``X`` int8 (torchao's CPU W8A8 shifts the activation
    to uint8 for oneDNN's u8s8 kernel); else None."""
    if not (_call(u, prims.convert_element_type.default) and u.args[1] == torch.uint8):
        return None
    add = u.args[0]
    if not (_call(add, aten.add.Tensor) and add.args[1] == 128):
        return None
    i32 = add.args[0]
    if not (_call(i32, prims.convert_element_type.default) and i32.args[1] == torch.int32):
        return None
    x = i32.args[0]
    return x if _val(x) is not None and _val(x).dtype == torch.int8 else None


def _w8a8_operands(node: fx.Node) -> tuple[fx.Node, fx.Node, str] | None:
    """``(X, W, how)`` when ``node`` computes the int32 ``X @ W.T`` of an int8 ``X`` and int8 ``W`` ``[N, K]``:
    torchao's uint8-shifted form with its column-sum correction (the ``sub``; torch >= 2.13 on the CPU), or a
    plain ``_int_mm(X, W.T)`` (torch 2.11, whose CPU ``_int_mm`` takes int8 only); else None."""
    if _call(node, aten.sub.Tensor):
        mm, corr = node.args
        if not (_call(mm, aten._int_mm.default) and _call(corr, aten.mul.Tensor) and corr.args[1] == 128):
            return None
        u, p = mm.args
        colsum = corr.args[0]
        if not (_call(colsum, aten.sum.dim_IntList) and colsum.args[0] is p and list(colsum.args[1]) == [0]):
            return None
        xq, how = _int8_activation(u), " (no column sum)"
    elif _call(node, aten._int_mm.default):
        xq, p = node.args
        how = ""
        if _val(xq) is None or _val(xq).dtype != torch.int8:
            return None
    else:
        return None
    if xq is None or not (_call(p, aten.permute.default) and list(p.args[1]) == [1, 0]):
        return None
    return xq, p.args[0], how


def _w8a8_reduction(graph: fx.Graph, node: fx.Node, xq: fx.Node, x: torch.Tensor, w: fx.Node, wv: torch.Tensor,
                    fake_mode: object) -> fx.Node:
    """Insert, before ``node``, ``int32(reduction(float(xq), w))``: the int32 ``[M, N]`` product (see below)."""
    with graph.inserting_before(node):
        xf = graph.call_function(prims.convert_element_type.default, (xq, torch.float32))
    with fake_mode:
        xv = torch.empty_strided(x.shape, x.stride(), dtype=torch.float32, device=x.device)
        xf.meta["val"] = xv
    total = _reduction(graph, node, xf, xv, w, wv, fake_mode, node.meta)
    with graph.inserting_before(node):
        out = graph.call_function(prims.convert_element_type.default, (total, torch.int32))
    with fake_mode:
        out.meta["val"] = torch.empty((x.shape[0], wv.shape[0]), dtype=torch.int32, device=x.device)
    for new in (xf, out):
        new.meta.update({key: v for key, v in node.meta.items() if key not in ("val", "tensor_meta")})
    return out


def rewrite_w8a8(gm: fx.GraphModule, scheme: object) -> list[str]:
    """torchao's CPU W8A8 linear computes ``_int_mm(uint8(X + 128), W.T) - 128 * colsum(W.T)``: exact, but the
    column sum reads the whole int8 weight a second time every step (4864x896: 0.33 ms on top of the 0.39 ms
    ``_int_mm``, measured; not folded, the weight is an input of the graph). For a decode-sized ``X`` the pair
    (or a plain ``_int_mm(X, W.T)``, as torch 2.11 runs it) becomes the reduction above over ``float(X)`` and the
    int8 weight, converted back to int32: products of two int8 values and their sums are integers, exact in
    float32 up to 2^24 and rounded to a neighbouring integer beyond (a relative 6e-8, far inside
    max-autotune's tolerance)."""
    done: list[str] = []
    fake_mode = None
    for node in list(gm.graph.nodes):
        found = _w8a8_operands(node)
        if found is None:
            continue
        xq, w, how = found
        x, wv = _val(xq), _val(w)
        if x is None or wv is None or wv.dtype != torch.int8 or wv.dim() != 2 or x.dim() != 2 \
                or x.shape[0] > MAX_ROWS or x.shape[1] != wv.shape[1]:
            continue
        fake_mode = fake_mode or _fake_mode(x, wv)
        graph = gm.graph
        out = _kernel_call(graph, node, scheme.kernels[0].op, xq, w, x, wv, fake_mode, node.meta)
        way = KERNEL if out is not None else REDUCTION
        if out is None:
            out = _w8a8_reduction(graph, node, xq, x, w, wv, fake_mode)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done.append(f"{scheme.report_name} GEMV {tuple(x.shape)} x {tuple(wv.shape)}^T as {way}{how}")
    return done


def rewrite_int4(gm: fx.GraphModule, scheme: object) -> list[str]:
    """torchao's CPU int4 weight-only linear calls ATen's ``_weight_int4pack_mm_for_cpu``; with float32
    activations ATen runs a reference loop (7.4 ms for a 4864x896 GEMV here, 41x our kernel's 0.18 ms:
    ``benchmarks/results/quant_gemv_int4.md``) and Inductor's int4 template takes bfloat16 activations only.
    A decode-sized float32 call becomes our kernel (same layout, float32 accumulation: the result differs
    from ATen's in the last bits, max-autotune's tolerance); without AVX2 the call stays ATen's."""
    from superkernel.runtime.cpu import quant_kernels
    from superkernel.runtime.cpu.int4_eager import takes

    done: list[str] = []
    for node in list(gm.graph.nodes):
        if not _call(node, aten._weight_int4pack_mm_for_cpu.default) or len(node.args) != 4 or node.kwargs:
            continue
        a, w, group, sz = node.args
        x, wv, szv = _val(a), _val(w), _val(sz)
        if x is None or wv is None or szv is None or not takes(x, wv, group, szv) or x.shape[0] > MAX_ROWS:
            continue
        n, k = wv.shape[0], x.shape[1]
        op = scheme.kernels[0].op
        if not quant_kernels.fast_path(op):  # said, not silent: ATen's float32 call is slow
            why = quant_kernels.unavailable_reason() or "no AVX2 here, or no vector kernel for ATen's packed layout"
            done.append(f"{scheme.report_name} GEMV {tuple(x.shape)} x ({n}, {k})^T left to ATen's float32 "
                        f"_weight_int4pack_mm_for_cpu, a slow reference loop ({why})")
            continue
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(getattr(torch.ops.superkernel, op).default, (a, w, group, sz))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        done.append(f"{scheme.report_name} GEMV {tuple(x.shape)} x ({n}, {k})^T (groups of {group}) as {INT4_KERNEL}")
    return done


__all__ = ["MAX_ROWS", "rewrite_int4", "rewrite_int8_weight", "rewrite_quantized_gemv", "rewrite_w8a8"]
