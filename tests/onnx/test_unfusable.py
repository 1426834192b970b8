"""Issue 25: attention forms no rule fuses are reported as near misses with the reason
(DeBERTa's disentangled attention), and ordinary attention is not."""

from __future__ import annotations

import onnx_ir as ir
import torch

from superkernel.onnx import catalog, engine, unfusable


def _tiny_deberta(path) -> str:
    import transformers as T

    from superkernel.onnx.hfsuite import Built, _Outputs, export_built

    cfg = T.DebertaV2Config(vocab_size=1000, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                            num_hidden_layers=1, relative_attention=True, position_buckets=16,
                            max_relative_positions=-1, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                            share_att_key=True, position_biased_input=False, type_vocab_size=0,
                            max_position_embeddings=64)
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (1, 16))
    built = Built(_Outputs(T.DebertaV2Model(cfg), "ids_mask"), (ids, torch.ones(1, 16, dtype=torch.int64)),
                  ["input_ids", "attention_mask"], ["y"])
    return export_built(built, "legacy", path)


def test_deberta_disentangled_attention_is_a_named_near_miss(tmp_path):
    model = ir.load(_tiny_deberta(tmp_path / "deberta.onnx"))
    result = engine.fuse(model, catalog.select_rules("attention", 3))
    misses = [m for m in result.near_misses if m.reason == unfusable.DISENTANGLED]
    assert len(misses) == 1 and misses[0].op == "Softmax" and misses[0].rule == "attention"
    assert "GatherElements" in misses[0].reason and not result.applied


def test_ordinary_attention_is_not_reported_as_disentangled(exported):
    for key in ("bert", "llama"):
        model = ir.load(exported(key))
        assert unfusable.disentangled_softmaxes(model.graph) == []
