"""Part m4 of benchmarks/gpu_decode_kernels.py: a Llama-shaped decode step (random weights) run two ways on the same
weights and caches: by the kernel set (``decode_kernels/layer.py``: six launches a layer, two for the head) and by
the same work in PyTorch (``decode_kernels/eager.py``, as a Llama layer writes it) for Inductor to compile as
superkernel's CUDA max-autotune does. Embedding and the rotary table lookup are plain PyTorch in both. With
``int8=True`` the kernel set's int8 weight-only form of the same step (``eager`` is then not defined: bfloat16 only).
"""

from __future__ import annotations

from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels import eager
from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape
from superkernel.runtime.cuda.decode_kernels.layer import LayerWeights, decode_layer, default_launches, head


class Step:
    """Weights of ``layers`` layers, embedding, final norm and lm_head at ``shape``; static caches prefilled with
    random K/V (what a prefill would have left); the rotary tables of every position."""

    def __init__(self, shape: DecodeShape, layers: int, device: str | torch.device, seed: int = 0,
                 launches: dict[str, dict[str, Any]] | None = None, int8: bool = False) -> None:
        """``int8``: every layer's projections and lm_head int8 weight-only (per channel, as torchao's), quantized
        from the same bfloat16 weights the same seed gives; embedding and norms stay bfloat16."""
        device = torch.device(device)
        gen = torch.Generator(device).manual_seed(seed)
        h, i, d = shape.hidden, shape.intermediate, shape.head_dim

        def randn(*size: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
            return (torch.randn(size, generator=gen, device=device) * scale + offset).to(torch.bfloat16)

        def w(n: int, k: int) -> torch.Tensor:
            return randn(n, k, scale=k ** -0.5)

        self.shape, self.launches = shape, launches or default_launches()
        self.layers = [LayerWeights(randn(h, scale=0.1, offset=1.0), w(shape.qkv_rows, h),
                                    w(h, shape.n_q_heads * d), randn(h, scale=0.1, offset=1.0), w(i, h), w(i, h),
                                    w(h, i)) for _ in range(layers)]
        cache = (1, shape.n_kv_heads, shape.kv_len, d)
        self.k_caches = [randn(*cache) for _ in range(layers)]
        self.v_caches = [randn(*cache) for _ in range(layers)]
        self.embed = randn(shape.vocab, h)
        self.final_norm = randn(h, scale=0.1, offset=1.0)
        self.w_lm = w(shape.vocab, h)
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(shape.kv_len, device=device, dtype=torch.float32), inv_freq)
        self.cos = torch.cat([angles.cos()] * 2, dim=-1).to(torch.bfloat16)  # [S, D]
        self.sin = torch.cat([angles.sin()] * 2, dim=-1).to(torch.bfloat16)
        self.s_lm = None
        if int8:
            from superkernel.runtime.cuda.decode_kernels.problems import quantize_int8

            self.layers = [weights.quantized_int8() for weights in self.layers]
            q, scale = quantize_int8(self.w_lm)
            self.w_lm, self.s_lm = q.to(device), scale.to(device)

    def weight_bytes(self) -> int:
        per_layer = sum(t.numel() * t.element_size() for t in vars(self.layers[0]).values() if t is not None)
        head = sum(t.numel() * t.element_size() for t in (self.w_lm, self.s_lm, self.final_norm) if t is not None)
        return per_layer * len(self.layers) + head

    def _inputs(self, token: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed.index_select(0, token.view(1)).view(-1)
        return x, self.cos.index_select(0, pos.view(1)).view(-1), self.sin.index_select(0, pos.view(1)).view(-1)

    def ours(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits ``[vocab]`` of the step at position ``pos`` (one-element device tensors)."""
        x, cos, sin = self._inputs(token, pos)
        length = pos + 1
        for weights, kc, vc in zip(self.layers, self.k_caches, self.v_caches):
            x = decode_layer(x, weights, cos, sin, pos, length, kc, vc, self.shape, self.launches)
        return head(x, self.final_norm, self.w_lm, self.shape, self.launches["lm_head"], scale=self.s_lm)

    def eager(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The same step in PyTorch, as a Llama model computes it (what Inductor compiles)."""
        s = self.shape
        qkv, attn, proj = eager.qkv_rope(s), eager.attention(s), eager.gemv_residual(s)
        mlp, lm = eager.gate_up(s), eager.lm_head(s)
        x, cos, sin = self._inputs(token, pos)
        for wt, kc, vc in zip(self.layers, self.k_caches, self.v_caches):
            q = qkv(x=x, norm=wt.input_norm, w_qkv=wt.w_qkv, cos=cos, sin=sin, pos=pos, k_cache=kc, v_cache=vc)
            a = attn(q=q, k_cache=kc, v_cache=vc, length=pos + 1)
            h = proj(x=a.reshape(-1), w=wt.w_o, residual=x)
            x = proj(x=mlp(x=h, norm=wt.post_norm, w_gate=wt.w_gate, w_up=wt.w_up), w=wt.w_down, residual=h)
        return lm(x=x, norm=self.final_norm, w=self.w_lm)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    """Two logits vectors: largest difference over the largest |b|, and whether the greedy token agrees."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    return {"max_diff_over_max": float((a64 - b64).abs().max() / b64.abs().max()),
            "top1_agrees": bool(a64.argmax() == b64.argmax())}
