"""Reference PyTorch blocks exported to ONNX: the models graph-autofusion is tested and benchmarked on.

``python -m superkernel.onnx.zoo {ln_mlp,bert,llama} --output PATH.onnx`` writes one of them.

The blocks are written the way real model code writes them (Hugging Face style), so the
exported graphs contain the decomposed patterns graph-autofusion looks for:

- ``ln_mlp``: a hand-written LayerNorm (mean / variance / sqrt, as in the original BERT
  code) followed by an MLP with exact (erf) GELU and a residual add.
- ``bert``: a BERT encoder layer: self-attention with an additive padding mask, output
  projection + residual + LayerNorm, intermediate projection with tanh-GELU, output
  projection + residual + LayerNorm.
- ``llama``: a Llama decoder layer: RMSNorm, q/k/v projections, rotary embedding computed
  from ``position_ids``, grouped-query causal attention (repeat_kv), residual, RMSNorm,
  SwiGLU MLP, residual.
"""

from __future__ import annotations

import argparse
import math
import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Dims:
    batch: int = 1
    seq: int = 8
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128


class BertStyleLayerNorm(nn.Module):
    """LayerNorm written out by hand, as in the original BERT code."""

    def __init__(self, hidden: int, eps: float = 1e-12):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight * x + self.bias


class LayerNormMLP(nn.Module):
    def __init__(self, d: Dims):
        super().__init__()
        self.norm = BertStyleLayerNorm(d.hidden, eps=1e-5)
        self.fc1 = nn.Linear(d.hidden, d.intermediate)
        self.fc2 = nn.Linear(d.intermediate, d.hidden)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class BertLayer(nn.Module):
    def __init__(self, d: Dims):
        super().__init__()
        self.heads = d.heads
        self.head_dim = d.hidden // d.heads
        self.query = nn.Linear(d.hidden, d.hidden)
        self.key = nn.Linear(d.hidden, d.hidden)
        self.value = nn.Linear(d.hidden, d.hidden)
        self.attn_out = nn.Linear(d.hidden, d.hidden)
        self.norm1 = BertStyleLayerNorm(d.hidden)
        self.inter = nn.Linear(d.hidden, d.intermediate)
        self.out = nn.Linear(d.intermediate, d.hidden)
        self.norm2 = BertStyleLayerNorm(d.hidden)

    def _split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        b, s, h = hidden_states.shape
        q = self._split(self.query(hidden_states))
        k = self._split(self.key(hidden_states))
        v = self._split(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        # attention_mask: (batch, seq) of 1 (keep) / 0 (pad), made additive as in BERT
        ext = (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * -10000.0
        probs = torch.softmax(scores + ext, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, h)
        x = self.norm1(self.attn_out(ctx) + hidden_states)
        y = self.out(F.gelu(self.inter(x), approximate="tanh"))
        return self.norm2(y + x)


class RMSNorm(nn.Module):
    """Llama RMSNorm as written in Hugging Face transformers."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d: Dims, rope_theta: float = 10000.0):
        super().__init__()
        self.heads, self.kv_heads = d.heads, d.kv_heads
        self.head_dim = d.hidden // d.heads
        self.input_layernorm = RMSNorm(d.hidden)
        self.q_proj = nn.Linear(d.hidden, d.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d.hidden, d.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d.hidden, d.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d.heads * self.head_dim, d.hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(d.hidden)
        self.gate_proj = nn.Linear(d.hidden, d.intermediate, bias=False)
        self.up_proj = nn.Linear(d.hidden, d.intermediate, bias=False)
        self.down_proj = nn.Linear(d.intermediate, d.hidden, bias=False)
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, position_ids):
        inv = self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, hidden_states, position_ids):
        b, s, _ = hidden_states.shape
        residual = hidden_states
        x = self.input_layernorm(hidden_states)
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((s, s), float("-inf")).triu(1)
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        attn = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        hidden_states = residual + self.o_proj(attn)
        residual = hidden_states
        x = self.post_attention_layernorm(hidden_states)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return residual + x


MODELS = {"ln_mlp": LayerNormMLP, "bert": BertLayer, "llama": LlamaDecoderLayer}


def example_inputs(name: str, d: Dims) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(d.batch, d.seq, d.hidden, generator=g)
    if name == "bert":
        mask = torch.ones(d.batch, d.seq, dtype=torch.int64)
        mask[:, -1] = 0
        return (x, mask)
    if name == "llama":
        return (x, torch.arange(d.seq, dtype=torch.int64)[None].expand(d.batch, -1).contiguous())
    return (x,)


INPUT_NAMES = {"ln_mlp": ["x"], "bert": ["hidden_states", "attention_mask"], "llama": ["hidden_states", "position_ids"]}


def export(name: str, path: str | os.PathLike, dims: Dims = Dims(), *, dynamic: bool = False,
           opset: int = 18, seed: int = 0, external_data: bool = False) -> str:
    """Export reference block ``name`` to ``path`` (ONNX) and return the path.

    ``dynamic=True`` makes batch and sequence symbolic (``batch``, ``seq``).
    """
    torch.manual_seed(seed)
    model = MODELS[name](dims).eval()
    args = example_inputs(name, dims)
    return export_module(model, args, path, input_names=INPUT_NAMES[name], dynamic=dynamic, opset=opset,
                         external_data=external_data)


def export_module(model: nn.Module, args: tuple, path: str | os.PathLike, *, input_names: list[str] | None = None,
                  dynamic: bool = False, opset: int = 18, external_data: bool = False) -> str:
    """torch.onnx.export (dynamo exporter) with the settings graph-autofusion is tested with.

    ``external_data=True`` puts the weights in ``<path>.data`` next to the model."""
    dynamic_shapes = None
    if dynamic:
        batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=4096)
        dynamic_shapes = tuple({0: batch, 1: seq} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(model, args, str(path), input_names=input_names, opset_version=opset,
                              dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False,
                              external_data=external_data)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m superkernel.onnx.zoo", description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("--output", required=True)
    p.add_argument("--batch", type=int, default=Dims.batch)
    p.add_argument("--seq", type=int, default=Dims.seq)
    p.add_argument("--hidden", type=int, default=Dims.hidden)
    p.add_argument("--heads", type=int, default=Dims.heads)
    p.add_argument("--kv-heads", type=int, default=Dims.kv_heads)
    p.add_argument("--intermediate", type=int, default=Dims.intermediate)
    p.add_argument("--dynamic", action="store_true", help="symbolic batch and sequence dimensions")
    p.add_argument("--external-data", action="store_true", help="weights in <output>.data next to the model")
    a = p.parse_args(argv)
    d = Dims(a.batch, a.seq, a.hidden, a.heads, a.kv_heads, a.intermediate)
    print(export(a.model, a.output, d, dynamic=a.dynamic, external_data=a.external_data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
