"""GQA decode attention over a static KV cache, split along the sequence (flash-decoding), then a reduction.

Program (kv head, split) reads its slice of the cache once for all ``G = Hq / Hkv`` query heads that share the kv
head (GQA-native: Inductor's and SDPA's decode paths read K/V per query head or expand them), with the query heads
padded to 16 rows so both products run as ``tl.dot`` (tensor cores need 16 rows). Online softmax in base 2 within a
slice; each split stores its normalized float32 output ``[D]`` and log-sum-exp per head, and the reduction weighs
the splits by ``2 ** (lse - max lse)``. The length ``L`` (positions ``0 .. L-1`` are attended, the step's own token
included) is read from a device tensor and each split's slice is ``ceil(L / SPLITS)`` long, so one CUDA graph
serves every step with work balanced over the splits; splits past ``L`` store ``lse = -inf`` and zeros.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def attn_split_kernel(q_ptr, kc_ptr, vc_ptr, len_ptr, o_ptr, lse_ptr, stride_kh, stride_ks, stride_vh, stride_vs,
                      qk_scale, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, SPLITS: tl.constexpr):
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    length = tl.load(len_ptr).to(tl.int32)
    chunk = tl.cdiv(length, SPLITS)
    s_lo = split * chunk
    s_hi = tl.minimum(s_lo + chunk, length)
    rg = tl.arange(0, GROUP_PAD)
    g_mask = rg < GROUP
    rd = tl.arange(0, BLOCK_D)
    d_mask = rd < HEAD_DIM
    heads = kvh * GROUP + rg
    q = tl.load(q_ptr + heads[:, None] * HEAD_DIM + rd[None, :], mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, BLOCK_D), dtype=tl.float32)
    k_base = kc_ptr + kvh.to(tl.int64) * stride_kh
    v_base = vc_ptr + kvh.to(tl.int64) * stride_vh
    for s0 in range(s_lo, s_hi, BLOCK_S):
        rs = s0 + tl.arange(0, BLOCK_S)
        s_mask = rs < s_hi
        kv_mask = s_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + rs[:, None] * stride_ks + rd[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * qk_scale  # [GROUP_PAD, BLOCK_S], log2 units
        scores = tl.where(s_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + rs[:, None] * stride_vs + rd[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    row = heads * SPLITS + split
    tl.store(o_ptr + row[:, None] * HEAD_DIM + rd[None, :], out, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(lse_ptr + row, lse, mask=g_mask)


@triton.jit
def attn_reduce_kernel(o_ptr, lse_ptr, out_ptr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                       SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr):
    head = tl.program_id(0)
    rs = tl.arange(0, BLOCK_SPLITS)
    s_mask = rs < SPLITS
    rd = tl.arange(0, BLOCK_D)
    d_mask = rd < HEAD_DIM
    lse = tl.load(lse_ptr + head * SPLITS + rs, mask=s_mask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 always holds a token: max is finite
    weight = weight / tl.sum(weight, axis=0)
    o = tl.load(o_ptr + (head * SPLITS + rs)[:, None] * HEAD_DIM + rd[None, :],
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    tl.store(out_ptr + head * HEAD_DIM + rd, tl.sum(weight[:, None] * o, axis=0).to(out_ptr.dtype.element_ty),
             mask=d_mask)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor, *,
                     splits: int = 8, sm_scale: float | None = None, out: torch.Tensor | None = None,
                     block_s: int = 64, num_warps: int = 4,
                     workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q ``[Hq, D]``; caches ``[Hkv, S, D]`` (or ``[1, Hkv, S, D]``), unit stride along D; ``length``: a one-element
    integer tensor, ``1 <= length <= S``. Returns ``[Hq, D]`` in q's dtype. ``workspace``: float32 ``[Hq, splits,
    D]`` and ``[Hq, splits]`` (made when not given)."""
    hq, d = q.shape
    kc = k_cache.reshape(k_cache.shape[-3:]) if k_cache.dim() == 4 else k_cache
    vc = v_cache.reshape(v_cache.shape[-3:]) if v_cache.dim() == 4 else v_cache
    hkv = kc.shape[0]
    if hq % hkv or kc.shape[-1] != d or kc.stride(-1) != 1 or vc.stride(-1) != 1 or not q.is_contiguous():
        raise ValueError("decode_attention: q [Hq, D] contiguous, caches [Hkv, S, D] with Hq % Hkv == 0 and unit "
                         "stride along D")
    group = hq // hkv
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E
    o_part, lse = workspace if workspace is not None else (
        torch.empty((hq, splits, d), dtype=torch.float32, device=q.device),
        torch.empty((hq, splits), dtype=torch.float32, device=q.device))
    if out is None:
        out = torch.empty((hq, d), dtype=q.dtype, device=q.device)
    block_d = max(16, triton.next_power_of_2(d))
    attn_split_kernel[(hkv, splits)](q, kc, vc, length, o_part, lse, kc.stride(0), kc.stride(1), vc.stride(0),
                                     vc.stride(1), scale, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
                                     HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s, SPLITS=splits,
                                     num_warps=num_warps)
    attn_reduce_kernel[(hq,)](o_part, lse, out, HEAD_DIM=d, BLOCK_D=block_d, SPLITS=splits,
                              BLOCK_SPLITS=max(2, triton.next_power_of_2(splits)), num_warps=1)
    return out
