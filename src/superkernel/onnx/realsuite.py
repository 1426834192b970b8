"""Real-width suite: encoders and a decode step at the widths of released checkpoints,
from transformers configs with seeded random weights (no hub download), exported with both
exporters (:func:`superkernel.onnx.hfsuite.export_built`).

- ``bert_base``: BERT-base (hidden 768, 12 heads, FFN 3072, vocab 30522), sequence 128;
- ``roberta_base``: RoBERTa-base (as BERT-base, vocab 50265; position ids from a cumsum over
  the input ids), sequence 128;
- ``deberta_v2``: DeBERTa-v3-base width (768, 12 heads, disentangled relative attention,
  vocab 128100), 6 layers, sequence 128;
- ``clip_text``: CLIP text encoder 512 wide, 8 heads, 6 layers, sequence 77;
- ``qwen2_decode``: one Qwen2-0.5B-wide decode step (hidden 896, 14 query / 2 key-value
  heads, FFN 4864, vocab 151936, q/k/v bias) with 127 past positions.

Depth (``layers``) is the one thing reduced: encoder layers repeat, and the width, heads and
sequence decide which kernels ONNX Runtime runs. ``LAYERS`` says how many each case has.

    python -m superkernel.onnx.realsuite bert_base --exporter legacy --output bert.onnx
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from .hfsuite import EXPORTERS, Built, _Outputs, decode_step, export_built

CASES = ("bert_base", "roberta_base", "deberta_v2", "clip_text", "qwen2_decode")
LAYERS = {"bert_base": 4, "roberta_base": 4, "deberta_v2": 6, "clip_text": 6, "qwen2_decode": 4}
PAST = 127


@dataclass(frozen=True)
class Shape:
    """What ORT's transformers optimizer (P2) needs to know about a case."""
    model_type: str
    heads: int
    hidden: int


SHAPES = {"bert_base": Shape("bert", 12, 768), "roberta_base": Shape("bert", 12, 768),
          "deberta_v2": Shape("bert", 12, 768), "clip_text": Shape("clip", 8, 512),
          "qwen2_decode": Shape("gpt2", 14, 896)}


def build(name: str, seed: int = 0, layers: int | None = None) -> Built:
    import transformers as T

    n = LAYERS[name] if layers is None else layers
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    sdpa = dict(attn_implementation="sdpa")
    if name in ("bert_base", "roberta_base", "deberta_v2"):
        seq = 128
        ids = torch.randint(5, 1000, (1, seq), generator=g)
        mask = torch.ones(1, seq, dtype=torch.int64)
        if name == "bert_base":
            cfg = T.BertConfig(num_hidden_layers=n, **sdpa)
            m = T.BertModel(cfg, add_pooling_layer=False)
        elif name == "roberta_base":
            cfg = T.RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                                  num_hidden_layers=n, **sdpa)
            m = T.RobertaModel(cfg, add_pooling_layer=False)
        else:
            cfg = T.DebertaV2Config(vocab_size=128100, num_hidden_layers=n, relative_attention=True,
                                    position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                                    norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                                    type_vocab_size=0, max_position_embeddings=512)
            m = T.DebertaV2Model(cfg)
        return Built(_Outputs(m, "ids_mask"), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"])
    if name == "clip_text":
        seq = 77
        cfg = T.CLIPTextConfig(hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_hidden_layers=n,
                               max_position_embeddings=77, **sdpa)
        ids = torch.randint(5, 1000, (1, seq), generator=g)
        mask = torch.ones(1, seq, dtype=torch.int64)
        return Built(_Outputs(T.CLIPTextModel(cfg), "ids_mask"), (ids, mask), ["input_ids", "attention_mask"],
                     ["last_hidden_state"])
    if name == "qwen2_decode":
        cfg = T.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=n,
                            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                            rope_theta=1000000.0, tie_word_embeddings=True, **sdpa)
        lm = T.Qwen2ForCausalLM(cfg)
        ids1 = torch.randint(5, 1000, (1, 1), generator=g)
        return decode_step(lm, n, ids1, kv_heads=2, head_dim=896 // 14, past=PAST, generator=g)
    raise ValueError(f"unknown real-width model {name!r} (known: {', '.join(CASES)})")


def export(name: str, exporter: str, path: str | os.PathLike, *, seed: int = 0, layers: int | None = None) -> str:
    return export_built(build(name, seed=seed, layers=layers), exporter, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m superkernel.onnx.realsuite", description=__doc__.splitlines()[0])
    p.add_argument("model", choices=CASES)
    p.add_argument("--exporter", choices=EXPORTERS, default="legacy")
    p.add_argument("--output", required=True)
    p.add_argument("--layers", type=int, default=None)
    a = p.parse_args(argv)
    print(export(a.model, a.exporter, a.output, layers=a.layers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
