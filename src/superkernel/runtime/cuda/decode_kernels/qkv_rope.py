"""RMSNorm + fused QKV GEMV + RoPE + KV-cache write, one kernel.

The fused weight ``[(Hq + 2 Hkv) * D, K]`` holds the q, k and v projections' rows one head after another (q heads,
then k heads, then v heads, as ``torch.cat([Wq, Wk, Wv])``). Hugging Face's rotary embedding pairs dimension ``d``
of a head with ``d + D/2`` (``rotate_half``), so a program owns ``BLOCK_P`` such pairs of one head: it accumulates
the low rows and the high rows side by side, and rotates them in registers:

    lo' = lo * cos[d] - hi * sin[d]        hi' = hi * cos[d + D/2] + lo * sin[d + D/2]

q heads go to ``q`` ``[Hq * D]``; k heads (rotated) and v heads (not rotated) go straight to row ``pos`` of the
static caches ``[Hkv, S, D]`` (a Hugging Face StaticCache layer's tensors at batch 1), ``pos`` read from a device
tensor so that a CUDA graph replays with the next position. ``cos``/``sin`` ``[D]`` are the step's rows (what the
model's rotary module computes once per step for all layers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from superkernel.runtime.cuda.decode_kernels.norm_prologue import rmsnorm_dot_pair


@triton.jit
def qkv_rope_kernel(x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, K,
                    stride_wn, stride_kh, stride_ks, stride_vh, stride_vs, eps, HAS_SCALE: tl.constexpr,
                    N_Q_HEADS: tl.constexpr, N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    HALF: tl.constexpr = HEAD_DIM // 2
    PER_HEAD: tl.constexpr = (HALF + BLOCK_P - 1) // BLOCK_P
    pid = tl.program_id(0)
    head = pid // PER_HEAD
    rp = (pid % PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = rp < HALF
    row_lo = head * HEAD_DIM + rp
    lo, hi = rmsnorm_dot_pair(x_ptr, g_ptr, w_ptr + row_lo[:, None] * stride_wn,
                              w_ptr + (row_lo + HALF)[:, None] * stride_wn, p_mask, K, eps,
                              BLOCK_ROWS=BLOCK_P, BLOCK_K=BLOCK_K)
    if HAS_SCALE:  # int8 weights, a scale per output row (as in gemv)
        lo = lo * tl.load(s_ptr + row_lo, mask=p_mask, other=0.0).to(tl.float32)
        hi = hi * tl.load(s_ptr + row_lo + HALF, mask=p_mask, other=0.0).to(tl.float32)
    if head < N_Q_HEADS + N_KV_HEADS:  # q and k heads are rotated, v heads are not
        c_lo = tl.load(cos_ptr + rp, mask=p_mask, other=0.0).to(tl.float32)
        c_hi = tl.load(cos_ptr + HALF + rp, mask=p_mask, other=0.0).to(tl.float32)
        s_lo = tl.load(sin_ptr + rp, mask=p_mask, other=0.0).to(tl.float32)
        s_hi = tl.load(sin_ptr + HALF + rp, mask=p_mask, other=0.0).to(tl.float32)
        out_lo = lo * c_lo - hi * s_lo
        out_hi = hi * c_hi + lo * s_hi
    else:
        out_lo = lo
        out_hi = hi
    if head < N_Q_HEADS:
        dst = q_ptr + head * HEAD_DIM + rp
        tl.store(dst, out_lo.to(q_ptr.dtype.element_ty), mask=p_mask)
        tl.store(dst + HALF, out_hi.to(q_ptr.dtype.element_ty), mask=p_mask)
    else:
        pos = tl.load(pos_ptr).to(tl.int64)
        if head < N_Q_HEADS + N_KV_HEADS:
            dst = kc_ptr + (head - N_Q_HEADS) * stride_kh + pos * stride_ks + rp
            tl.store(dst, out_lo.to(kc_ptr.dtype.element_ty), mask=p_mask)
            tl.store(dst + HALF, out_hi.to(kc_ptr.dtype.element_ty), mask=p_mask)
        else:
            dst = vc_ptr + (head - N_Q_HEADS - N_KV_HEADS) * stride_vh + pos * stride_vs + rp
            tl.store(dst, out_lo.to(vc_ptr.dtype.element_ty), mask=p_mask)
            tl.store(dst + HALF, out_hi.to(vc_ptr.dtype.element_ty), mask=p_mask)


def qkv_rope(x: torch.Tensor, norm: torch.Tensor, w_qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, n_q_heads: int, n_kv_heads: int,
             head_dim: int, eps: float = 1e-5, q_out: torch.Tensor | None = None, block_p: int = 8,
             block_k: int = 512, num_warps: int = 4, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Returns q ``[Hq, D]``; writes row ``pos`` of ``k_cache`` and ``v_cache`` (``[Hkv, S, D]``, or a StaticCache
    layer's ``[1, Hkv, S, D]``). ``pos``: an integer tensor of one element on the kernel's device. ``scale``: the
    per-row scales ``[(Hq + 2 Hkv) * D]`` of an int8 ``w_qkv`` (int8 weight-only)."""
    k = x.numel()
    if head_dim % 2 or w_qkv.shape != ((n_q_heads + 2 * n_kv_heads) * head_dim, k) or w_qkv.stride(1) != 1:
        raise ValueError(f"qkv_rope: w_qkv must be [(Hq + 2 Hkv) * D, K] = "
                         f"[{(n_q_heads + 2 * n_kv_heads) * head_dim}, {k}] with unit stride along K and D even, "
                         f"got {tuple(w_qkv.shape)}, D={head_dim}")
    if (w_qkv.dtype == torch.int8) != (scale is not None):
        raise ValueError("qkv_rope: an int8 w_qkv needs its per-row scale, and only an int8 weight takes one")
    kc = k_cache.reshape(k_cache.shape[-3:]) if k_cache.dim() == 4 else k_cache
    vc = v_cache.reshape(v_cache.shape[-3:]) if v_cache.dim() == 4 else v_cache
    if kc.stride(-1) != 1 or vc.stride(-1) != 1 or kc.shape[0] != n_kv_heads or kc.shape[-1] != head_dim:
        raise ValueError("qkv_rope: caches must be [Hkv, S, D] with unit stride along D")
    if kc.data_ptr() != k_cache.data_ptr() or vc.data_ptr() != v_cache.data_ptr():
        raise ValueError("qkv_rope: the caches must be written in place")
    q = q_out if q_out is not None else torch.empty(n_q_heads * head_dim, dtype=x.dtype, device=x.device)
    grid = ((n_q_heads + 2 * n_kv_heads) * triton.cdiv(head_dim // 2, block_p),)
    s = scale.reshape(-1) if scale is not None else norm
    qkv_rope_kernel[grid](x.reshape(k), norm, w_qkv, s, cos.reshape(head_dim), sin.reshape(head_dim), pos, q, kc,
                          vc, k, w_qkv.stride(0), kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1), eps,
                          HAS_SCALE=scale is not None, N_Q_HEADS=n_q_heads, N_KV_HEADS=n_kv_heads,
                          HEAD_DIM=head_dim, BLOCK_P=block_p, BLOCK_K=block_k, num_warps=num_warps)
    return q.view(n_q_heads, head_dim)
