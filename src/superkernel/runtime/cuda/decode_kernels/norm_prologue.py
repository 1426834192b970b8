"""The RMSNorm-prologue K loop that ``gate_up`` and ``qkv_rope`` share, as one ``@triton.jit`` helper.

Both kernels read two row blocks of weights over all of K against the same normalized activation: gate_up the same
rows of ``Wg`` and ``Wu``, qkv_rope the low and the high half of each rotary pair of one head. The norm costs no pass
of its own: ``W @ (x * g * rstd) = rstd * (W @ (x * g))``, so the loop that reads the weights also sums ``x * x``
and ``rstd`` scales the two finished dot products (``gemv`` folds its norm the same way, over a split K range).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rmsnorm_dot_pair(x_ptr, g_ptr, a_rows, b_rows, row_mask, K, eps,
                     BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """``(rstd * (A @ (x * g)), rstd * (B @ (x * g)))`` in float32 for ``BLOCK_ROWS`` rows each.

    ``a_rows`` / ``b_rows``: ``[BLOCK_ROWS, 1]`` pointers to the first element of each row (unit stride along K);
    ``row_mask``: ``[BLOCK_ROWS]``, rows past the weight's end read as zeros.
    """
    acc_a = tl.zeros((BLOCK_ROWS, BLOCK_K), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_ROWS, BLOCK_K), dtype=tl.float32)
    sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        x = tl.load(x_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
        sq += x * x
        x = x * tl.load(g_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
        mask = row_mask[:, None] & k_mask[None, :]
        wa = tl.load(a_rows + rk[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        wb = tl.load(b_rows + rk[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        acc_a += wa.to(tl.float32) * x[None, :]
        acc_b += wb.to(tl.float32) * x[None, :]
    rstd = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
    return tl.sum(acc_a, axis=1) * rstd, tl.sum(acc_b, axis=1) * rstd
