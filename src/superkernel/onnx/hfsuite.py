"""Tiny random-weight Hugging Face models exported to ONNX with both PyTorch exporters.

The suite of ``benchmarks/onnx_autofusion.py``: BERT, DistilBERT, BART
encoder, ViT, GPT-2, T5 encoder and Llama, plus a Llama decode step with past key/value
inputs and present outputs. Weights are seeded random (built from configs, no hub
download). Each model is exported with ``torch.onnx.export(..., dynamo=False)`` (the
TorchScript exporter, opset 17, what most ONNX files in the wild are) and with
``dynamo=True`` (opset 18). Shapes are static (batch 1, sequence ``seq``).

    python -m superkernel.onnx.hfsuite bert --exporter legacy --output bert.onnx

This module imports torch and transformers; the graph-autofusion product does not.
"""

from __future__ import annotations

import argparse
import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from superkernel.hf_cache_names import cache_keyword, output_cache

HIDDEN, HEADS, LAYERS, INTER = 128, 4, 2, 512
CASES = ("bert", "distilbert", "bart_encoder", "vit", "gpt2", "t5_encoder", "llama", "llama_decode")
EXPORTERS = ("legacy", "dynamo")


@dataclass
class Built:
    module: nn.Module
    args: tuple
    input_names: list[str]
    output_names: list[str]


class _Outputs(nn.Module):
    """Wraps a HF model so the export returns plain tensors."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, *args):
        if self.kind == "vit":
            return self.model(pixel_values=args[0]).last_hidden_state
        if self.kind == "ids":
            return self.model(input_ids=args[0]).last_hidden_state
        if self.kind == "ids_mask":
            return self.model(input_ids=args[0], attention_mask=args[1]).last_hidden_state
        if self.kind == "t5":
            return self.model(input_ids=args[0], attention_mask=args[1]).last_hidden_state
        if self.kind == "causal_lm":
            return self.model(input_ids=args[0], attention_mask=args[1], use_cache=False).logits
        raise ValueError(self.kind)


class _LlamaDecode(nn.Module):
    """One decode step: input_ids [B, 1], attention_mask [B, P+1], position_ids [B, 1],
    past key/value per layer [B, kv_heads, P, head_dim] -> logits, present key/value."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **{cache_keyword(self.model): cache})
        present = []
        for i in range(self.layers):
            layer = output_cache(out).layers[i]
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def decode_step(lm: nn.Module, layers: int, ids1: torch.Tensor, *, kv_heads: int, head_dim: int, past: int,
                generator: torch.Generator) -> Built:
    """One decode step of a causal LM: one new token over ``past`` random cached K/V per layer
    (inputs past_key_values.i.key/value, outputs present.i.key/value beside the logits)."""
    am = torch.ones(1, past + 1, dtype=torch.int64)
    pos = torch.tensor([[past]], dtype=torch.int64)
    pkv, names, outs = [], [], ["logits"]
    for i in range(layers):
        pkv += [torch.randn(1, kv_heads, past, head_dim, generator=generator),
                torch.randn(1, kv_heads, past, head_dim, generator=generator)]
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return Built(_LlamaDecode(lm, layers), (ids1, am, pos, *pkv), ["input_ids", "attention_mask", "position_ids", *names],
                 outs)


def build(name: str, seq: int = 64, past: int = 127, seed: int = 0, attn: str = "sdpa") -> Built:
    import transformers as T

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (1, seq), generator=g)
    mask = torch.ones(1, seq, dtype=torch.int64)
    common = dict(attn_implementation=attn)
    if name == "bert":
        cfg = T.BertConfig(vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           intermediate_size=INTER, max_position_embeddings=512, **common)
        m = _Outputs(T.BertModel(cfg, add_pooling_layer=False), "ids_mask")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    if name == "distilbert":
        cfg = T.DistilBertConfig(vocab_size=1000, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=INTER,
                                 max_position_embeddings=512, **common)
        m = _Outputs(T.DistilBertModel(cfg), "ids_mask")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    if name == "bart_encoder":
        cfg = T.BartConfig(vocab_size=1000, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                           encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=INTER,
                           decoder_ffn_dim=INTER, max_position_embeddings=512, **common)
        m = _Outputs(T.BartModel(cfg).get_encoder(), "ids_mask")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    if name == "vit":
        cfg = T.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=INTER, image_size=64, patch_size=8, **common)
        px = torch.randn(1, 3, 64, 64, generator=g)
        m = _Outputs(T.ViTModel(cfg, add_pooling_layer=False), "vit")
        return Built(m, (px,), ["pixel_values"], ["last_hidden_state"])
    if name == "gpt2":
        cfg = T.GPT2Config(vocab_size=1000, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=512,
                           n_inner=INTER, **common)
        m = _Outputs(T.GPT2Model(cfg), "ids_mask")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    if name == "t5_encoder":
        cfg = T.T5Config(vocab_size=1000, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=INTER, num_layers=LAYERS,
                         num_heads=HEADS, **common)
        m = _Outputs(T.T5EncoderModel(cfg), "t5")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    llama_cfg = T.LlamaConfig(vocab_size=1000, hidden_size=HIDDEN, intermediate_size=INTER // 2 * 3 // 2 * 2,
                              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                              max_position_embeddings=1024, **common)
    if name == "llama":
        m = _Outputs(T.LlamaForCausalLM(llama_cfg), "causal_lm")
        return Built(m, (ids, mask), ["input_ids", "attention_mask"], ["logits"])
    if name == "llama_decode":
        lm = T.LlamaForCausalLM(llama_cfg)
        ids1 = torch.randint(0, 1000, (1, 1), generator=g)
        return decode_step(lm, LAYERS, ids1, kv_heads=HEADS // 2, head_dim=HIDDEN // HEADS, past=past, generator=g)
    raise ValueError(f"unknown suite model {name!r} (known: {', '.join(CASES)})")


def export(name: str, exporter: str, path: str | os.PathLike, *, seq: int = 64, past: int = 127,
           seed: int = 0) -> str:
    """Export suite model ``name`` with ``exporter`` ('legacy': dynamo=False, opset 17;
    'dynamo': dynamo=True, opset 18) to ``path``; returns the path."""
    return export_built(build(name, seq=seq, past=past, seed=seed), exporter, path)


def export_built(b: Built, exporter: str, path: str | os.PathLike) -> str:
    """Export a built model with ``exporter`` ('legacy' / 'dynamo') to ``path``."""
    mod = b.module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(mod, b.args, str(path), input_names=b.input_names, output_names=b.output_names,
                              opset_version=17, dynamo=False, do_constant_folding=True)
        elif exporter == "dynamo":
            torch.onnx.export(mod, b.args, str(path), input_names=b.input_names, output_names=b.output_names,
                              opset_version=18, dynamo=True, verbose=False)
        else:
            raise ValueError(f"unknown exporter {exporter!r} (known: {', '.join(EXPORTERS)})")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m superkernel.onnx.hfsuite", description=__doc__.splitlines()[0])
    p.add_argument("model", choices=CASES)
    p.add_argument("--exporter", choices=EXPORTERS, default="legacy")
    p.add_argument("--output", required=True)
    p.add_argument("--seq", type=int, default=64)
    a = p.parse_args(argv)
    print(export(a.model, a.exporter, a.output, seq=a.seq))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
