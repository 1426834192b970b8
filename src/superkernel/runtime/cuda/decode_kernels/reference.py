"""Float64 references of the decode kernels, and the tolerance a bfloat16 kernel is held to.

Each reference computes in float64 from the same (bfloat16) inputs the kernel reads, with no intermediate rounding:
the kernel's only errors are then its float32 accumulation and the rounding of what it stores.
"""

from __future__ import annotations

import math

import torch

#: bfloat16 keeps 8 significant bits: rounding to nearest is off by at most half a unit in the last place, at most
#: 2**-8 of the value. (Triton 3.6's interpreter truncates instead, up to 2**-7: ``interpret.fix_bf16`` makes it round
#: as the GPU does.)
BF16_REL = 2.0 ** -8


def bf16_tolerance(ref: torch.Tensor, floor: float = 2e-3) -> torch.Tensor:
    """Per-element tolerance of a bfloat16 output against its float64 reference: the output's own rounding
    (``BF16_REL * |ref|``) plus ``floor * max|ref|`` for what comes on top: float32 accumulation over K terms (a few
    float32 ulps of the sum, far below 2e-3 of the largest output at K <= 8192; it decides ties of the rounding),
    and in attention the weights rounded to bfloat16 for the P @ V product (each off by at most 2**-9 of itself:
    the output by at most 2**-9 of max|V| times the weights' sum, 1)."""
    return BF16_REL * ref.abs() + floor * ref.abs().max()


def check(name: str, got: torch.Tensor, ref: torch.Tensor, floor: float = 2e-3) -> float:
    """Raise if ``got`` is off ``ref`` by more than :func:`bf16_tolerance` anywhere; return the largest error as a
    fraction of ``max|ref|`` (what the reports print)."""
    got64 = got.detach().to("cpu", torch.float64).reshape(ref.shape)
    err = (got64 - ref).abs()
    tol = bf16_tolerance(ref, floor)
    if not bool(torch.isfinite(got64).all()):
        raise AssertionError(f"{name}: non-finite values in the kernel's output")
    bad = err > tol
    if bool(bad.any()):
        i = int(torch.argmax((err - tol).flatten()))
        raise AssertionError(f"{name}: {int(bad.sum())} of {err.numel()} elements beyond the bfloat16 tolerance; "
                             f"worst at flat index {i}: got {float(got64.flatten()[i]):.6g}, "
                             f"want {float(ref.flatten()[i]):.6g}, tolerance {float(tol.flatten()[i]):.3g}")
    return float(err.max() / ref.abs().max().clamp_min(1e-30))


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def rms_normed(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    x = _d(x)
    return x * torch.rsqrt(x.pow(2).mean() + eps) * _d(g)


def gemv(x: torch.Tensor, w: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 1e-5,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """``W @ rmsnorm(x)`` (or ``W @ x``) plus the residual: x ``[K]``, w ``[N, K]``."""
    xin = rms_normed(x, norm, eps) if norm is not None else _d(x)
    y = _d(w) @ xin
    return y + _d(residual) if residual is not None else y


def gate_up(x: torch.Tensor, norm: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
            eps: float = 1e-5) -> torch.Tensor:
    """``silu(Wg @ rmsnorm(x)) * (Wu @ rmsnorm(x))``."""
    h = rms_normed(x, norm, eps)
    gate, up = _d(w_gate) @ h, _d(w_up) @ h
    return gate * torch.sigmoid(gate) * up


def rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face Llama's rotary embedding of ``v [..., D]``: ``v * cos + rotate_half(v) * sin``."""
    half = v.shape[-1] // 2
    rot = torch.cat([-v[..., half:], v[..., :half]], dim=-1)
    return v * _d(cos) + rot * _d(sin)


def qkv_rope(x: torch.Tensor, norm: torch.Tensor, w_qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             n_q_heads: int, n_kv_heads: int, head_dim: int,
             eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``[Hq, D]`` and the step's k, v ``[Hkv, D]``: q and k rotated, v not."""
    y = _d(w_qkv) @ rms_normed(x, norm, eps)
    q = y[: n_q_heads * head_dim].reshape(n_q_heads, head_dim)
    k = y[n_q_heads * head_dim: (n_q_heads + n_kv_heads) * head_dim].reshape(n_kv_heads, head_dim)
    v = y[(n_q_heads + n_kv_heads) * head_dim:].reshape(n_kv_heads, head_dim)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int,
                     sm_scale: float | None = None) -> torch.Tensor:
    """Attention of one query per head over the first ``length`` cache positions (GQA: query head h reads kv head
    ``h // (Hq // Hkv)``): q ``[Hq, D]``, caches ``[Hkv, S, D]``; returns ``[Hq, D]``."""
    hq, d = q.shape
    hkv = k_cache.shape[0]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    k = _d(k_cache[:, :length]).repeat_interleave(hq // hkv, dim=0)
    v = _d(v_cache[:, :length]).repeat_interleave(hq // hkv, dim=0)
    p = torch.softmax(torch.einsum("hd,hsd->hs", _d(q), k) * scale, dim=-1)
    return torch.einsum("hs,hsd->hd", p, v)
