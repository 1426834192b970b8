"""The generic tiny-config shrink keeps the couplings a config relies on (config only, no model built).

Each rule is checked on a plain dict (the rule itself) and on the transformers config that made it
necessary (the sweep listed these as "not eligible" when the shrink broke them).
"""

from __future__ import annotations

import pytest

from superkernel.tools.models.registry import OVERRIDES, _shrink_config, _shrink_layers, _shrink_scalars, tiny_config


def test_per_layer_lists_and_layer_ids_shrink_with_the_depth_keeping_the_same_layers():
    values = {"num_hidden_layers": 8, "layer_types": ["a", "a", "b", "a", "a", "b", "a", "a"],
              "intermediate_size": [512] * 8, "sparsity": [0.9, 0.9, 0.9, 0.9, 0, 0, 0, 0], "attn_layer_ids": [2, 5]}
    out: dict = {}
    _shrink_layers(values, out)
    # first layer of every kind (layer type x sparsity), in order: layers 0, 2, 4, 5
    assert out["num_hidden_layers"] == 4
    assert out["layer_types"] == ["a", "b", "a", "b"]
    assert out["sparsity"] == [0.9, 0.9, 0, 0]
    assert out["intermediate_size"] == [128] * 4  # a size per layer is shrunk, not sliced
    assert out["attn_layer_ids"] == [1, 3]  # ids renumbered to the kept layers


def test_counted_layers_are_recounted_on_the_kept_layers():
    values = {"num_hidden_layers": 35, "num_kv_shared_layers": 15, "first_k_dense_replace": 3}
    out: dict = {}
    _shrink_layers(values, out)
    assert out["num_hidden_layers"] == 3  # dense, sparse, sparse + KV-shared
    assert out["first_k_dense_replace"] == 1 and out["num_kv_shared_layers"] == 1


def test_mla_head_and_alias_couplings():
    assert _shrink_scalars({"head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64})["head_dim"] == 16 + 8
    assert _shrink_scalars({"head_dim": 64, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64})["head_dim"] == 8
    assert _shrink_scalars({"head_dim": 128, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64})["head_dim"] == 16
    # None KV heads: as many as heads
    assert _shrink_scalars({"num_attention_heads": 48, "num_key_value_heads": None})["num_key_value_heads"] == 4


@pytest.mark.parametrize(("model_type", "check"), [
    ("gemma3n_text", lambda c: len(c.intermediate_size) == len(c.layer_types) == c.num_hidden_layers
     and set(c.layer_types) == {"sliding_attention", "full_attention"} and 0 < c.num_kv_shared_layers < c.num_hidden_layers),
    ("zamba2", lambda c: len(c.layers_block_type) == c.num_hidden_layers and "hybrid" in c.layers_block_type),
    ("mamba2", lambda c: c.num_heads * c.head_dim == c.expand * c.hidden_size == 128),
    ("dots3_note", lambda c: c.vision_config.adapter_out_dim == c.text_config.hidden_size == 64
     and c.audio_config.adapter_out_dim == 64),
    ("axk1", lambda c: c.head_dim == c.qk_rope_head_dim == 8 and c.qk_head_dim == 24),
    ("jamba", lambda c: (c.attn_layer_period, c.attn_layer_offset, c.num_hidden_layers) == (2, 1, 2)),
    ("recurrent_gemma", lambda c: c.num_hidden_layers == 3),  # one period of recurrent, recurrent, attention
    ("bailing_hybrid", lambda c: c.num_experts == 4 and c.num_experts_per_token == 2),  # aliases are shrunk too
    ("lfm2", lambda c: c.num_hidden_layers == 2),  # full_attn_idxs [0..31] names layers: no 32-layer stack
])
def test_generated_configs_keep_their_couplings(model_type, check):
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not in this transformers ({__import__('transformers').__version__})")
    config = tiny_config(model_type)
    assert check(config), config


def test_only_changes_are_passed_and_derived_fields_recompute():
    from transformers import AutoConfig

    kwargs = _shrink_config(AutoConfig.for_model("deepseek_v2"))
    assert "qk_head_dim" not in kwargs  # derived by the class from the shrunk nope + rope
    assert "rms_norm_eps" not in kwargs  # unchanged: the class default stays
    assert tiny_config("deepseek_v2").qk_head_dim == 16 + 8


def test_every_override_says_why():
    assert all(isinstance(why, str) and len(why) > 20 for _, why in OVERRIDES.values())
