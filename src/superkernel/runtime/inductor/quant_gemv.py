"""max-autotune on CPU: an int8 weight-only GEMV with float32 activations reads its int8 weights once.

A weight-only int8 linear (torchao's ``Int8WeightOnlyConfig``) reaches Inductor as
``mm(x, convert_element_type(permute(w_int8), float32)) * scale``: Inductor materializes the whole weight
in float32 and calls an external GEMM on it, so the GEMV reads the weights five times over (int8 in,
float32 out, float32 in again) and is slower than the float model (issue 37: 7.99 ms against 3.82 ms for
the float32 MLP). Inductor's own weight-only pattern (``_weight_int8pack_mm``) fires for bfloat16
activations only, and ATen's float32 ``_weight_int8pack_mm`` is a reference loop (11.6 ms for one
4864x896 GEMV here, against 1.0 ms for the float32 GEMV).

For a decode-sized left operand (at most :data:`MAX_ROWS` rows) this pass rewrites the ``mm`` as a
reduction, ``sum(x[:, None, :] * float(w_int8), -1)``, which Inductor's C++ backend emits as one
vectorized loop that loads int8, converts and accumulates in float32. ``x`` is materialized first
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


def rewrite_int8_weight_gemv(gm: fx.GraphModule) -> list[str]:
    """Rewrite every decode-sized float32 x int8-weight ``mm`` of ``gm`` as a reduction (see module doc);
    returns one line per rewrite (for explain)."""
    from torch._guards import detect_fake_mode

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
        if fake_mode is None:
            fake_mode = detect_fake_mode([x, wv]) or torch._subclasses.fake_tensor.FakeTensorMode()
        graph = gm.graph
        with graph.inserting_before(node):
            wf = graph.call_function(prims.convert_element_type.default, (w, torch.float32))
            xr = graph.call_function(_materialized(), (a, list(x.stride())))
            xs = graph.call_function(aten.unsqueeze.default, (xr, 1))
            prod = graph.call_function(aten.mul.Tensor, (xs, wf))
            rows, n, k = x.shape[0], wv.shape[0], x.shape[1]
            chunks = _chunks(k)
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
            xs.meta["val"] = torch.empty((x.shape[0], 1, x.shape[1]), dtype=torch.float32, device=x.device)
            prod.meta["val"] = torch.empty((x.shape[0], wv.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
            out.meta["val"] = torch.empty((x.shape[0], wv.shape[0]), dtype=torch.float32, device=x.device)
            if extra:
                extra[0].meta["val"] = torch.empty((rows, n, chunks, k // chunks), dtype=torch.float32, device=x.device)
                extra[1].meta["val"] = torch.empty((rows, n, chunks), dtype=torch.float32, device=x.device)
        for new in (wf, xr, xs, prod, *extra, out):
            new.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done.append(f"int8 weight-only GEMV {tuple(x.shape)} x {tuple(wv.shape)}^T as a reduction reading int8")
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


__all__ = ["MAX_ROWS", "rewrite_int8_weight_gemv"]
