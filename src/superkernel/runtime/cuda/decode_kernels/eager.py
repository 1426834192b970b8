"""Each kernel's computation as a Hugging Face Llama layer writes it in PyTorch (bfloat16, Llama's float32 norm):
what Inductor compiles for the same work (the GPU benchmark's "Inductor" rows), and the operator sequences the
max-autotune hookup will match in a scope's graph (docs/gpu.md, "Decode kernel set").

Each function takes a problem's inputs (``problems.make_inputs``) by keyword and returns what the kernel returns.
Products run on one row ``[1, K]``, as in the model's step (``[1, 1, K]`` flattened), so that Inductor sees the
``mm`` with M = 1 that it turns into a reduction, not a matrix-vector ``mv``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: float32 statistics, the normalized values rounded to x's dtype, then the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = v.shape[-1] // 2
    return v * cos + torch.cat([-v[..., half:], v[..., :half]], dim=-1) * sin


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``w @ x`` for x ``[K]`` as the step computes it: ``F.linear`` of one row."""
    return F.linear(x.view(1, -1), w).view(-1)


def qkv_rope(shape: DecodeShape) -> Callable[..., torch.Tensor]:
    hq, hkv, d = shape.n_q_heads, shape.n_kv_heads, shape.head_dim

    def fn(*, x, norm, w_qkv, cos, sin, pos, k_cache, v_cache):
        y = linear(rms_norm(x, norm, shape.eps), w_qkv)
        q, k, v = y.split([hq * d, hkv * d, hkv * d])
        q, k = rotate(q.view(hq, d), cos, sin), rotate(k.view(hkv, d), cos, sin)
        k_cache.index_copy_(2, pos, k.view(1, hkv, 1, d))  # StaticCache.update: index_copy_ at the position
        v_cache.index_copy_(2, pos, v.view(1, hkv, 1, d))
        return q

    return fn


def attention(shape: DecodeShape) -> Callable[..., torch.Tensor]:
    """SDPA over the whole static cache with a mask of the first ``length`` positions (how a decode step with a
    StaticCache attends), GQA by ``enable_gqa``."""

    def fn(*, q, k_cache, v_cache, length):
        mask = (torch.arange(k_cache.shape[2], device=q.device) < length).view(1, 1, 1, -1)
        out = F.scaled_dot_product_attention(q.view(1, shape.n_q_heads, 1, shape.head_dim), k_cache, v_cache,
                                             attn_mask=mask, enable_gqa=True)
        return out.view(shape.n_q_heads, shape.head_dim)

    return fn


def gate_up(shape: DecodeShape) -> Callable[..., torch.Tensor]:
    def fn(*, x, norm, w_gate, w_up):
        h = rms_norm(x, norm, shape.eps)
        return F.silu(linear(h, w_gate)) * linear(h, w_up)

    return fn


def gemv_residual(shape: DecodeShape) -> Callable[..., torch.Tensor]:  # noqa: ARG001 (same signature as the rest)
    def fn(*, x, w, residual):
        return residual + linear(x, w)

    return fn


def lm_head(shape: DecodeShape) -> Callable[..., torch.Tensor]:
    def fn(*, x, norm, w):
        return linear(rms_norm(x, norm, shape.eps), w)

    return fn


FUNCTIONS: dict[str, Callable[[DecodeShape], Callable[..., torch.Tensor]]] = {
    "qkv_rope": qkv_rope, "attention": attention, "o_proj": gemv_residual, "gate_up": gate_up,
    "down": gemv_residual, "lm_head": lm_head}


def function(name: str, shape: DecodeShape) -> Callable[..., torch.Tensor]:
    return FUNCTIONS[name](shape)


def gemv_only(name: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    """The problem's weight product(s) alone, as ``F.linear`` (cuBLAS on the GPU): the GEMV the kernel fuses
    around. None for attention."""
    if name == "attention":
        return None  # type: ignore[return-value]
    x = inputs["x"]
    if name == "gate_up":
        return lambda: (linear(x, inputs["w_gate"]), linear(x, inputs["w_up"]))
    w = inputs["w_qkv"] if name == "qkv_rope" else inputs["w"]
    return lambda: linear(x, w)
