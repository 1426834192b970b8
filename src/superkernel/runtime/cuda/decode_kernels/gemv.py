"""A batch-1 GEMV ``y = W @ x`` (W ``[N, K]`` row-major, bfloat16; float32 accumulation) with an optional RMSNorm
prologue, an optional residual epilogue and an optional split along K:

* o-projection + residual and down projection + residual: ``gemv(x, w, residual=r)``;
* final RMSNorm + lm_head: ``gemv(x, w, norm=g, split_k=S)``;
* int8 weight-only (int8 W, a float32 scale per output channel, bfloat16 x): ``gemv(x, w_int8, scale=s, ...)``
  with any of the above; ``split_k`` is what a small-N int8 GEMV needs to fill the card (half the bytes per row).

The norm costs no pass of its own: ``W @ (x * g * rstd) = rstd * (W @ (x * g))``, so the loop over K that reads W
also sums ``x * x``, and ``rstd`` scales the finished dot products. Split-K writes float32 partial sums
``[S, N]`` and a second kernel adds them, applies ``rstd`` (it reads x itself) and the residual, and rounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def gemv_kernel(x_ptr, g_ptr, w_ptr, s_ptr, r_ptr, y_ptr, N, K, stride_wn, eps,
                HAS_NORM: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (n, s): rows ``[n * BLOCK_N, (n + 1) * BLOCK_N)`` over the s-th K slice. ``SPLIT_K == 1``: the
    finished output (norm, residual, rounding); otherwise float32 partial sums into ``y_ptr`` ``[SPLIT_K, N]``.
    ``HAS_SCALE``: W holds int8 and row n's values are ``W[n] * s[n]`` (per-channel, weight-only): the int8 row is
    widened exactly to float32 in the loop and the scale multiplies the finished (partial) dot product, which is
    linear, so a split-K partial may carry it."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    k_span = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K  # a whole number of blocks per slice
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < k_hi
        x = tl.load(x_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            sq += x * x
            x = x * tl.load(g_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_SCALE:
        y = y * tl.load(s_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    if SPLIT_K == 1:
        if HAS_NORM:
            y = y * tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
        if HAS_RESIDUAL:
            y += tl.load(r_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.store(y_ptr + pid_k * N + rn, y, mask=n_mask)


@triton.jit
def splitk_reduce_kernel(part_ptr, x_ptr, r_ptr, y_ptr, N, K, eps,
                         HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SPLIT_K: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Sums the ``SPLIT_K`` partial rows of ``part_ptr`` ``[SPLIT_K, N]`` for ``BLOCK_N`` outputs; with the norm,
    recomputes ``rstd`` from x (K values from L2: cheaper than a third kernel)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        y += tl.load(part_ptr + s * N + rn, mask=n_mask, other=0.0)
    if HAS_NORM:
        sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
            sq += x * x
        y = y * tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
    if HAS_RESIDUAL:
        y += tl.load(r_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv(x: torch.Tensor, w: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 1e-5,
         residual: torch.Tensor | None = None, out: torch.Tensor | None = None, split_k: int = 1,
         block_n: int = 8, block_k: int = 512, num_warps: int = 4, reduce_block_n: int = 256,
         workspace: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``W @ rmsnorm(x, norm) + residual`` for x ``[K]`` (or ``[1, K]``), w ``[N, K]`` with unit stride along K;
    returns ``[N]`` in x's dtype (or writes ``out``). ``workspace``: float32 ``[split_k, N]`` for split-K (made when
    not given; pass one to keep a CUDA graph free of allocations). ``scale``: ``[N]`` (or ``[N, 1]``) per-channel
    scales of an int8 ``w`` (int8 weight-only: ``W[n] * scale[n]``); required with an int8 weight."""
    n, k = w.shape
    x = x.reshape(k)
    if w.stride(1) != 1 or x.stride(0) != 1:
        raise ValueError("gemv: W and x need unit stride along K")
    if (w.dtype == torch.int8) != (scale is not None):
        raise ValueError("gemv: an int8 weight needs its per-channel scale, and only an int8 weight takes one")
    s = scale.reshape(n) if scale is not None else x
    if out is None:
        out = torch.empty(n, dtype=x.dtype, device=x.device)
    g = norm if norm is not None else x
    r = residual.reshape(n) if residual is not None else out
    flags = dict(HAS_NORM=norm is not None, HAS_RESIDUAL=residual is not None, SPLIT_K=split_k)
    scaled = dict(flags, HAS_SCALE=scale is not None)
    n_blocks = triton.cdiv(n, block_n)
    if split_k == 1:
        gemv_kernel[(n_blocks, 1)](x, g, w, s, r, out, n, k, w.stride(0), eps, **scaled, BLOCK_N=block_n,
                                   BLOCK_K=block_k, num_warps=num_warps)
        return out
    part = workspace if workspace is not None else torch.empty((split_k, n), dtype=torch.float32, device=x.device)
    gemv_kernel[(n_blocks, split_k)](x, g, w, s, r, part, n, k, w.stride(0), eps, **scaled, BLOCK_N=block_n,
                                     BLOCK_K=block_k, num_warps=num_warps)
    splitk_reduce_kernel[(triton.cdiv(n, reduce_block_n),)](part, x, r, out, n, k, eps, **flags,
                                                            BLOCK_N=reduce_block_n, BLOCK_K=512, num_warps=4)
    return out
