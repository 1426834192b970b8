"""RMSNorm + gate/up GEMV + SiLU(gate) * up, one kernel: ``h = silu(Wg @ n) * (Wu @ n)``, ``n = rmsnorm(x) * g``.

Each program reads the same ``BLOCK_N`` rows of ``Wg`` and ``Wu`` over all of K (the loop shared with ``qkv_rope``:
``norm_prologue.rmsnorm_dot_pair``; ``rstd`` scales the finished dot products), so the gate and up values of one
output meet in registers and leave as one bfloat16 ``h``; Inductor's step writes gate and up and reads them back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from superkernel.runtime.cuda.decode_kernels.norm_prologue import rmsnorm_dot_pair


@triton.jit
def gate_up_kernel(x_ptr, g_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, h_ptr, N, K, stride_wg, stride_wu, eps,
                   HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    gate, up = rmsnorm_dot_pair(x_ptr, g_ptr, wg_ptr + rn[:, None] * stride_wg, wu_ptr + rn[:, None] * stride_wu,
                                n_mask, K, eps, BLOCK_ROWS=BLOCK_N, BLOCK_K=BLOCK_K)
    if HAS_SCALE:  # int8 weights, a scale per output channel (as in gemv)
        gate = gate * tl.load(sg_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
        up = up * tl.load(su_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + rn, h.to(h_ptr.dtype.element_ty), mask=n_mask)


def gate_up(x: torch.Tensor, norm: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *, eps: float = 1e-5,
            out: torch.Tensor | None = None, block_n: int = 4, block_k: int = 512,
            num_warps: int = 4, scale_gate: torch.Tensor | None = None,
            scale_up: torch.Tensor | None = None) -> torch.Tensor:
    """x ``[K]``, norm ``[K]``, w_gate and w_up ``[N, K]`` with unit stride along K (two views of one fused
    ``[2N, K]`` weight are fine); returns h ``[N]`` in x's dtype. int8 weights take their per-channel scales
    ``scale_gate`` / ``scale_up`` ``[N]``."""
    n, k = w_gate.shape
    if w_up.shape != (n, k) or w_gate.stride(1) != 1 or w_up.stride(1) != 1:
        raise ValueError("gate_up: w_gate and w_up must both be [N, K] with unit stride along K")
    if (w_gate.dtype == torch.int8) != (scale_gate is not None) or (scale_gate is None) != (scale_up is None):
        raise ValueError("gate_up: int8 weights need both per-channel scales, and only int8 weights take them")
    x = x.reshape(k)
    sg = scale_gate.reshape(n) if scale_gate is not None else x
    su = scale_up.reshape(n) if scale_up is not None else x
    if out is None:
        out = torch.empty(n, dtype=x.dtype, device=x.device)
    gate_up_kernel[(triton.cdiv(n, block_n),)](x, norm, w_gate, w_up, sg, su, out, n, k, w_gate.stride(0),
                                               w_up.stride(0), eps, HAS_SCALE=scale_gate is not None,
                                               BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return out
