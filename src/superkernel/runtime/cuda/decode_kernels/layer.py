"""A Llama-style decode layer and the head as the kernel set runs them: six launches a layer, two for the head.

    q = qkv_rope(x)                    RMSNorm + QKV GEMV + RoPE, K and V written into the caches at ``pos``
    a = attention(q, caches, pos + 1)  split along the sequence, then merged
    h = o_proj(a) + x
    m = gate_up(h)                     RMSNorm + gate/up GEMV + SiLU * up
    y = down(m) + h

``LayerWeights.from_hf`` takes a Hugging Face ``LlamaDecoderLayer`` (the q, k and v weights concatenated once).
What the backend's hookup will call per matched layer (docs/gpu.md, "Decode kernel set"); the GPU benchmark's m4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES, DecodeShape


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    w_qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    w_o: torch.Tensor  # [H, Hq D]
    post_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [I, H]
    w_up: torch.Tensor  # [I, H]
    w_down: torch.Tensor  # [H, I]

    @classmethod
    def from_hf(cls, layer: Any) -> "LayerWeights":
        attn, mlp = layer.self_attn, layer.mlp
        if any(getattr(m, "bias", None) is not None for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)):
            raise ValueError("projections with a bias are not in the kernel set")
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).contiguous()
        return cls(layer.input_layernorm.weight, qkv, attn.o_proj.weight, layer.post_attention_layernorm.weight,
                   mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)

    @classmethod
    def random(cls, shape: DecodeShape, device: str | torch.device = "cpu", seed: int = 0) -> "LayerWeights":
        gen = torch.Generator().manual_seed(seed)
        h, i = shape.hidden, shape.intermediate
        qd = shape.n_q_heads * shape.head_dim

        def w(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16)

        def g(n: int) -> torch.Tensor:
            return (1 + 0.1 * torch.randn(n, generator=gen)).to(device, torch.bfloat16)

        return cls(g(h), w(shape.qkv_rows, h), w(h, qd), g(h), w(i, h), w(i, h), w(h, i))


def default_launches() -> dict[str, dict[str, Any]]:
    return {name: dict(candidates[0]) for name, candidates in CANDIDATES.items()}


def decode_layer(x: torch.Tensor, weights: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                 length: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, shape: DecodeShape,
                 launches: dict[str, dict[str, Any]] | None = None) -> torch.Tensor:
    """One decode step of one layer for hidden state x ``[H]``: writes the caches at ``pos``, attends over the first
    ``length`` positions (``pos + 1``; both device tensors) and returns the layer's output ``[H]``."""
    from superkernel.runtime.cuda.decode_kernels.attention import decode_attention
    from superkernel.runtime.cuda.decode_kernels.gate_up import gate_up
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv
    from superkernel.runtime.cuda.decode_kernels.qkv_rope import qkv_rope

    launch = launches or default_launches()
    x = x.reshape(shape.hidden)
    q = qkv_rope(x, weights.input_norm, weights.w_qkv, cos, sin, pos, k_cache, v_cache, n_q_heads=shape.n_q_heads,
                 n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, eps=shape.eps, **launch["qkv_rope"])
    a = decode_attention(q, k_cache, v_cache, length, **launch["attention"])
    h = gemv(a.reshape(-1), weights.w_o, residual=x, **launch["o_proj"])
    m = gate_up(h, weights.post_norm, weights.w_gate, weights.w_up, eps=shape.eps, **launch["gate_up"])
    return gemv(m, weights.w_down, residual=h, **launch["down"])


def head(x: torch.Tensor, final_norm: torch.Tensor, w_lm: torch.Tensor, shape: DecodeShape,
         launch: dict[str, Any] | None = None) -> torch.Tensor:
    """Final RMSNorm + lm_head: logits ``[vocab]`` in x's dtype."""
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv

    return gemv(x.reshape(-1), w_lm, norm=final_norm, eps=shape.eps, **(launch or dict(CANDIDATES["lm_head"][0])))


def reference_layer(x: torch.Tensor, weights: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, pos: int,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, shape: DecodeShape) -> torch.Tensor:
    """The same layer in float64 with no rounding between the steps (caches: the values before this step)."""
    from superkernel.runtime.cuda.decode_kernels import reference as r

    q, k, v = r.qkv_rope(x, weights.input_norm, weights.w_qkv, cos, sin, shape.n_q_heads, shape.n_kv_heads,
                         shape.head_dim, shape.eps)
    kc, vc = r._d(k_cache).reshape(k_cache.shape[-3:]).clone(), r._d(v_cache).reshape(v_cache.shape[-3:]).clone()
    kc[:, pos], vc[:, pos] = k, v
    a = r.decode_attention(q, kc, vc, pos + 1)
    h = r._d(weights.w_o) @ a.reshape(-1) + r._d(x)
    m = r.gate_up(h, weights.post_norm, weights.w_gate, weights.w_up, shape.eps)
    return r._d(weights.w_down) @ m + h
