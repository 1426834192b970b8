"""A Llama-style decode layer and the head as the kernel set runs them: six launches a layer, two for the head.

    q = qkv_rope(x)                    RMSNorm + QKV GEMV + RoPE, K and V written into the caches at ``pos``
    a = attention(q, caches, pos + 1)  split along the sequence, then merged
    h = o_proj(a) + x
    m = gate_up(h)                     RMSNorm + gate/up GEMV + SiLU * up
    y = down(m) + h

``LayerWeights.from_hf`` takes a Hugging Face ``LlamaDecoderLayer`` (the q, k and v weights concatenated once), in
bfloat16 or int8 weight-only by torchao (its ``Int8Tensor`` unwrapped into plain int8 rows and float32 per-channel
scales, which every weight-reading kernel of the set takes). What the hookup (``hookup.py``, through the operator of
``op.py``) calls per layer; the GPU benchmark's m4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES, DecodeShape


def int8_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(plain weight, None) for a plain tensor; (int8 ``[N, K]``, float32 scale ``[N]``) for torchao's int8
    weight-only tensor (symmetric, one scale per output channel). Raises ``ValueError`` naming what else it is."""
    qdata = getattr(weight, "qdata", None)
    if qdata is None:
        return weight, None
    scale = getattr(weight, "scale", None)
    n, k = weight.shape
    zero = getattr(weight, "zero_point", None)
    block = list(getattr(weight, "block_size", [1, k]))
    if (qdata.dtype != torch.int8 or tuple(qdata.shape) != (n, k) or scale is None or scale.numel() != n
            or block != [1, k] or (zero is not None and bool(zero.ne(0).any()))):
        raise ValueError(f"a quantized weight that is not int8 weight-only per channel ({type(weight).__name__}, "
                         f"{qdata.dtype}, block {block})")
    return qdata.contiguous(), scale.detach().reshape(n).float().contiguous()


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    w_qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    w_o: torch.Tensor  # [H, Hq D]
    post_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [I, H]
    w_up: torch.Tensor  # [I, H]
    w_down: torch.Tensor  # [H, I]
    #: int8 weight-only: each weight's float32 per-channel scales (all None for bfloat16 weights)
    s_qkv: torch.Tensor | None = None
    s_o: torch.Tensor | None = None
    s_gate: torch.Tensor | None = None
    s_up: torch.Tensor | None = None
    s_down: torch.Tensor | None = None

    @property
    def int8(self) -> bool:
        return self.s_qkv is not None

    @classmethod
    def from_hf(cls, layer: Any) -> "LayerWeights":
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(getattr(m, "bias", None) is not None for m in linears):
            raise ValueError("projections with a bias are not in the kernel set")
        parts = [int8_parts(m.weight) for m in linears]
        if len({s is None for _, s in parts}) != 1:
            raise ValueError("some projections int8, others not: the kernel set takes a layer all of one kind")
        (wq, sq), (wk, sk), (wv, sv), (wo, so), (wg, sg), (wu, su), (wd, sd) = parts
        qkv = torch.cat([wq, wk, wv]).contiguous()
        s_qkv = torch.cat([sq, sk, sv]) if sq is not None else None
        return cls(layer.input_layernorm.weight, qkv, wo, layer.post_attention_layernorm.weight, wg, wu, wd,
                   s_qkv, so, sg, su, sd)

    def dequantized(self) -> "LayerWeights":
        """The same layer with float64 weights (int8 times scale, or the plain weights): the reference's view."""
        def d(w: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
            w = w.detach().to("cpu", torch.float64)
            return w * s.detach().to("cpu", torch.float64).reshape(-1, 1) if s is not None else w

        return LayerWeights(self.input_norm, d(self.w_qkv, self.s_qkv), d(self.w_o, self.s_o), self.post_norm,
                            d(self.w_gate, self.s_gate), d(self.w_up, self.s_up), d(self.w_down, self.s_down))

    def quantized_int8(self) -> "LayerWeights":
        """This bfloat16 layer int8 weight-only (symmetric, per channel, as torchao makes it)."""
        from superkernel.runtime.cuda.decode_kernels.problems import quantize_int8

        (wq, sq), (wo, so), (wg, sg), (wu, su), (wd, sd) = (
            quantize_int8(w) for w in (self.w_qkv, self.w_o, self.w_gate, self.w_up, self.w_down))
        dev = self.w_qkv.device
        return LayerWeights(self.input_norm, wq.to(dev), wo.to(dev), self.post_norm, wg.to(dev), wu.to(dev),
                            wd.to(dev), sq.to(dev), so.to(dev), sg.to(dev), su.to(dev), sd.to(dev))

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
                 launches: dict[str, dict[str, Any]] | None = None, sm_scale: float | None = None) -> torch.Tensor:
    """One decode step of one layer for hidden state x ``[H]``: writes the caches at ``pos``, attends over the first
    ``length`` positions (``pos + 1``; both device tensors) and returns the layer's output ``[H]``. int8 weights
    (``weights.int8``) run the same launches with their scales."""
    from superkernel.runtime.cuda.decode_kernels.attention import decode_attention
    from superkernel.runtime.cuda.decode_kernels.gate_up import gate_up
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv
    from superkernel.runtime.cuda.decode_kernels.qkv_rope import qkv_rope

    launch = launches or default_launches()
    x = x.reshape(shape.hidden)
    q = qkv_rope(x, weights.input_norm, weights.w_qkv, cos, sin, pos, k_cache, v_cache, n_q_heads=shape.n_q_heads,
                 n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, eps=shape.eps, scale=weights.s_qkv,
                 **launch["qkv_rope"])
    a = decode_attention(q, k_cache, v_cache, length, sm_scale=sm_scale, **launch["attention"])
    h = gemv(a.reshape(-1), weights.w_o, residual=x, scale=weights.s_o, **launch["o_proj"])
    m = gate_up(h, weights.post_norm, weights.w_gate, weights.w_up, eps=shape.eps, scale_gate=weights.s_gate,
                scale_up=weights.s_up, **launch["gate_up"])
    return gemv(m, weights.w_down, residual=h, scale=weights.s_down, **launch["down"])


def head(x: torch.Tensor, final_norm: torch.Tensor, w_lm: torch.Tensor, shape: DecodeShape,
         launch: dict[str, Any] | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Final RMSNorm + lm_head: logits ``[vocab]`` in x's dtype (``scale``: an int8 ``w_lm``'s per-row scales)."""
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv

    return gemv(x.reshape(-1), w_lm, norm=final_norm, eps=shape.eps, scale=scale,
                **(launch or dict(CANDIDATES["lm_head"][0])))


def reference_layer(x: torch.Tensor, weights: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, pos: int,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, shape: DecodeShape) -> torch.Tensor:
    """The same layer in float64 with no rounding between the steps (caches: the values before this step; int8
    weights: times their scales)."""
    from superkernel.runtime.cuda.decode_kernels import reference as r

    weights = weights.dequantized()
    q, k, v = r.qkv_rope(x, weights.input_norm, weights.w_qkv, cos, sin, shape.n_q_heads, shape.n_kv_heads,
                         shape.head_dim, shape.eps)
    kc, vc = r._d(k_cache).reshape(k_cache.shape[-3:]).clone(), r._d(v_cache).reshape(v_cache.shape[-3:]).clone()
    kc[:, pos], vc[:, pos] = k, v
    a = r.decode_attention(q, kc, vc, pos + 1)
    h = r._d(weights.w_o) @ a.reshape(-1) + r._d(x)
    m = r.gate_up(h, weights.post_norm, weights.w_gate, weights.w_up, shape.eps)
    return r._d(weights.w_down) @ m + h
