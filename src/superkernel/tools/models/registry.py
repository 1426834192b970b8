"""Tiny configs for every causal-LM architecture transformers registers, generated, not hand-listed.

The list comes from transformers itself (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, each
``model_type`` also in ``CONFIG_MAPPING_NAMES``). A tiny config is the architecture's
default config with its size attributes shrunk generically by name (:data:`SHRINK`:
hidden size 64, 2 layers, 4 heads, vocabulary 256, ...), recursively in sub-configs
(a vision tower, a text config). Only what changes is passed, and only what the class takes
(derived attributes recompute from the shrunk ones). The depth shrinks together with
everything per layer: per-layer lists, layer-index lists, counted layers (first-k dense,
KV-shared), ``per_layer_config`` and ``<kind>_layer_period`` keep the first layer of every
kind. Couplings stay: a size equal to a model width follows it, an MLA head stays nope +
rope (or rope), Mamba-2 heads x head size stay the inner width. Where a hand-checked entry of
:mod:`.archs` exists it is used instead (its overrides are explained there), and
:data:`OVERRIDES` holds the per-architecture fixes no general rule can make, mostly defaults
that are no working model, each with its reason.

Which of them can run the decode harness at all is measured, not assumed: see
:mod:`.eligibility`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

#: Attribute name -> tiny value. Only attributes the default config already has are set.
SHRINK: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim", "hidden_dim", "word_embed_proj_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers",
                     "encoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads",
                     "encoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim",
                     "ffn_hidden_size", "intermediate_size_mlp"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("head_dim", "d_head", "dim_head"), 16),  # = hidden 64 / 4 heads
    # unpadded_vocab_size: the LM head's width where the embedding is padded (Inkling2, transformers 5.24)
    **dict.fromkeys(("vocab_size", "unpadded_vocab_size"), 256),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"), 256),
    **dict.fromkeys(("sliding_window", "attention_chunk_size"), 16),  # < the sweep's prompt of 20: they roll
    "tie_word_embeddings": False,
}

#: Caps: an attribute is lowered to this when larger (top-k must stay <= the experts).
CAP: dict[str, int] = {"num_experts_per_tok": 2, "top_k": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 32,
                       "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                       "first_k_dense_replace": 1, "n_shared_experts": 1, "num_shared_experts": 1,
                       "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                       "linear_value_head_dim": 16, "num_key_value_groups": 2, "rotary_dim": 8}

#: Token ids outside the tiny vocabulary are moved into it (some models need a pad id: the
#: position ids of RoBERTa-like models skip it): pad 255, bos 254, eos 253, others 252.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")

_QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
        "indexer_compress_ratio": 4}
_QSA_WHY = ("the default's indexed-attention layers have no QSA indexer settings (all None; the model divides by "
            "them); tiny ones that pass the config's own checks")

#: Per-architecture fixes the generic shrink cannot guess: model_type -> (overrides, why).
OVERRIDES: dict[str, tuple[dict[str, Any], str]] = {
    "falcon": ({"new_decoder_architecture": True, "parallel_attn": True},
               "the default is the 7B multi-query layout; the 40B/180B layout exercises grouped KV heads"),
    "gpt_neox": ({"rotary_pct": 0.5}, "partial rotary, as the released models"),
    "phi": ({"partial_rotary_factor": 0.5}, "partial rotary, as the released models"),
    "deepseek_v3": ({"rope_scaling": None}, "YaRN scaling of the 671B default needs its original length"),
    # Defaults that are no working model (the released checkpoints set these): the shrink cannot
    # invent a value the default does not have.
    "deepseek_v2": ({"num_experts_per_tok": 2}, "the default leaves the router's top-k None (DeepSeek-V2 uses 6)"),
    "dots1": ({"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
              "the default leaves the experts, shared experts and top-k None (dots.llm1: 128, 2, 6)"),
    "lfm2_moe": ({"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
                 "the default leaves layer_types None, which the model indexes; one dense conv layer, one MoE "
                 "attention layer"),
    "bamba": ({"attn_layer_indices": [1]}, "the default has no attention layer (attn_layer_indices None), and a "
              "cache of only linear-attention layers has no sequence length; Bamba-9B has attention layers"),
    "granitemoehybrid": ({"layer_types": ["linear_attention", "full_attention"]},
                         "the default is all Mamba layers (no sequence length in the cache, as bamba); the "
                         "released hybrids have attention layers"),
    "dbrx": ({"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8}},
             "the attention reads attn_config.rope_theta, which DbrxAttentionConfig does not declare, and clamps "
             "with clip_qkv, None by default; the released config.json carries both (500000, 8)"),
    **dict.fromkeys(("musicgen", "musicgen_melody"), (
        {"decoder": {"num_codebooks": 1}},
        "the decode harness feeds one row of token ids per sequence; MusicGen's decoder reads num_codebooks rows "
        "(4 by default) per sequence, so one codebook")),
    "modernbert-decoder": ({"local_attention": 32}, "its sliding window is derived (local_attention // 2): "
                           "a window of 16, shorter than the prompt, as the other sliding-window models"),
    "cohere_compass_text": ({"rope_parameters": {t: {"rope_type": "default", "rope_theta": 10000.0}
                                                  for t in ("full_attention", "sliding_attention")}},
                            "the default's rope_parameters is empty, and the rotary embedding reads one entry "
                            "per layer type"),
    "reformer": ({"is_decoder": True, "axial_pos_embds_dim": [32, 32], "axial_pos_shape": [16, 16]},
                 "ReformerModelWithLMHead is a causal LM only with is_decoder=True, which the default leaves False; "
                 "the axial position factors must sum to the width (64) and multiply to the positions (256)"),
    "xmod": ({"default_language": "en_XX"}, "X-MOD routes every layer through a language adapter and has no "
             "default language; en_XX is the default's only one"),
    "xlstm": ({"qk_dim_factor": 1.0}, "with the default 0.5 at width 64 transformers allocates the mLSTM state as "
              "(heads, v_dim, v_dim) and its own step rejects it (matC_old has wrong shape); at width 512 it does "
              "not. Query/key as wide as the value here"),
    "gpt_neo": ({"attention_types": [[["global", "local"], 1]]},
                "its layer pattern is attention_types ([kinds, repeats]), from which the per-layer list is derived"),
    "dory": ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "num_hidden_layers": 3,
              "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1},
             "its config serializes each layer as an (attention, mlp) pair and halves the counts again when it reads "
             "them, so the generic shrink's layer list does not match its layer count; one input, one looped and one "
             "output layer, sliding and full attention as the default's pattern mixes them"),
    "qwen4_exp_text": (_QSA, _QSA_WHY),
    "qwen4_exp": ({"text_config": _QSA}, _QSA_WHY),
}


def causal_lm_types() -> list[str]:
    """Every model_type transformers maps to a causal-LM class and a config class, sorted."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t in CONFIG_MAPPING_NAMES)


_DEPTHS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")

#: Layer counts that say which layers are of a kind: the first n (dense MLP before the MoE ones) or
#: the last n (layers that reuse an earlier layer's KV cache). They are recomputed for the kept layers.
COUNTED_LAYERS: dict[str, str] = {"first_k_dense_replace": "first", "num_dense_layers": "first",
                                  "num_kv_shared_layers": "last"}


def _fields(config) -> set[str] | None:
    """The attributes a config class takes as arguments (its dataclass fields), or None if unknown.

    Everything else in ``to_dict()`` is derived by the class itself (``__post_init__``: e.g. a
    ``qk_head_dim`` = nope + rope): a value the shrink derives from a default that way (an equal
    size) is not passed back, nor one of the shrink's names the class derives (a ``head_dim``).
    """
    import dataclasses

    return {f.name for f in dataclasses.fields(type(config))} if dataclasses.is_dataclass(config) else None


def _layer_lists(values: dict[str, Any], depth: int) -> tuple[dict[str, list], dict[str, list]]:
    """The per-layer lists of a config (one entry per layer) and its layer-index lists (sorted ids < depth)."""
    per_layer, indices = {}, {}
    for key, value in values.items():
        if not isinstance(value, (list, tuple)) or not value or key in TOKEN_IDS:
            continue
        ids = all(isinstance(v, int) and not isinstance(v, bool) for v in value) and \
            list(value) == sorted(set(value)) and value[-1] < depth
        if ids and any(word in key for word in ("layer", "idx", "ids", "indices")):
            indices[key] = list(value)  # full_attn_idxs = [0, 1, ..., 31] names layers, it is no per-layer list
        elif len(value) == depth:
            per_layer[key] = list(value)
    return per_layer, indices


def _counted(values: dict[str, Any], depth: int) -> dict[str, list[bool]]:
    """:data:`COUNTED_LAYERS` of a config as per-layer flags (is layer i among the counted ones)."""
    out = {}
    for key, end in COUNTED_LAYERS.items():
        n = values.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= depth:
            out[key] = [i < n if end == "first" else i >= depth - n for i in range(depth)]
    return out


def _pattern(values: dict[str, Any], depth: int) -> int | None:
    """The length of a cycled pattern of layer kinds (``block_types = ("recurrent", "recurrent",
    "attention")`` repeated over the depth), or None."""
    for key, value in values.items():
        if key.endswith("_types") and isinstance(value, (list, tuple)) and 1 < len(value) < depth and \
                all(isinstance(v, str) for v in value) and len(set(value)) > 1:
            return len(value)
    return None


def _layer_overrides(values: dict[str, Any], depth: int) -> list[dict] | None:
    """``per_layer_config`` (layer index -> settings that differ from the global ones) per layer, or None."""
    table = values.get("per_layer_config")
    if not isinstance(table, dict) or not table or not all(str(k).isdigit() for k in table):
        return None
    return [dict(table.get(next((k for k in table if int(k) == i), None), {}) or {}) for i in range(depth)]


def _shrink_override(values: dict[str, Any], out: dict[str, Any], override: dict) -> dict:
    """One layer's settings shrunk as the whole layer would be (its settings over the global ones, so
    that couplings across both hold), kept where they differ from the tiny global ones."""
    tiny = _shrink_scalars({**values, **override})
    return {k: tiny.get(k, v) for k, v in {**override, **tiny}.items()
            if k in override or tiny.get(k) != out.get(k, values.get(k))}


def _kept_layers(per_layer: dict[str, list], indices: dict[str, list], depth: int) -> list[int]:
    """Which layers of the default stack the tiny one keeps: the first layer of every kind, in order.

    A layer's kind is what the per-layer lists (except sizes, which are shrunk anyway) and the
    layer-index lists say about it; at least two layers, so that a layer follows a layer.
    """
    kinds = [k for k in per_layer if k not in SHRINK]
    kept: dict[tuple, int] = {}
    for i in range(depth):
        kind = tuple(str(per_layer[k][i]) for k in kinds) + tuple(i in ids for ids in indices.values())
        kept.setdefault(kind, i)
    out = sorted(kept.values())
    for i in range(depth):
        if len(out) >= 2:
            break
        if i not in out:
            out = sorted(out + [i])
    return out


def _shrink_layers(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Per-layer lists, layer-index lists and the depth shrunk together: the same layers kept in all."""
    depth = next((values[k] for k in _DEPTHS if isinstance(values.get(k), int)), None)
    if not depth:
        return
    pattern = _pattern(values, depth)
    if pattern:  # a cycled pattern of layer kinds: one period of it is the tiny stack
        for key in _DEPTHS:
            if key in values:
                out[key] = max(2, pattern)
    per_layer, indices = _layer_lists(values, depth)
    counted = _counted(values, depth)
    overrides = _layer_overrides(values, depth)
    if not per_layer and not indices and not counted and overrides is None:
        return
    kinds = {**per_layer, **counted, **({"per_layer_config": [sorted(o.items()) for o in overrides]} if overrides else {})}
    kept = _kept_layers(kinds, indices, depth)
    if overrides is not None:  # a kept layer keeps its own settings, shrunk by the same rules
        width = len(next(iter(values["per_layer_config"]), "0"))
        out["per_layer_config"] = {str(new).zfill(width): _shrink_override(values, out, overrides[old])
                                   for new, old in enumerate(kept) if overrides[old]}
    for key, flags in counted.items():
        out[key] = sum(flags[i] for i in kept)
    for key, value in per_layer.items():
        size = key.removesuffix("_per_layer")  # num_attention_heads_per_layer: a head count per layer
        if size in SHRINK and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            out[key] = [SHRINK[size]] * len(kept)  # a size per layer
        else:
            out[key] = [value[i] for i in kept]
    for key, ids in indices.items():
        out[key] = [kept.index(i) for i in ids if i in kept]
    for key in _DEPTHS:
        if key in values:
            out[key] = len(kept)


#: Sizes that are lengths or counts, not widths, even when they equal a width in the default.
_NOT_WIDTHS = ("vocab", "window", "chunk", "image", "patch", "position", "batch", "cache", "kernel", "block")


def _keep_equal_sizes(values: dict[str, Any], out: dict[str, Any], widths: dict[int, int]) -> None:
    """A size the shrink does not know that equals a model width in the default follows it.

    Couplings a config validates or a model relies on (``adapter_in_dim == hidden_size``, an
    adapter's output equal to the text tower's width) are usually of this form; a size that
    merely differs keeps its default, and so does one equal to another size (a head size, an MLP
    width): those equalities are often chance (Inkling's sliding-window head is not its head_dim).
    """
    shrunk = {values[k]: out[k] for k in _WIDTHS if isinstance(values.get(k), int)
              and not isinstance(values[k], bool) and isinstance(out.get(k), int)}
    shrunk.update(widths)
    for key, value in values.items():
        if key in out or key in SHRINK or key in CAP or isinstance(value, bool) or not isinstance(value, int):
            continue
        if (key.endswith("_dim") or key.endswith("_size")) and value in shrunk and \
                not any(word in key for word in _NOT_WIDTHS):
            out[key] = shrunk[value]


_WIDTHS = ("hidden_size", "n_embd", "d_model", "embed_dim", "hidden_dim")


def _widths(values: dict[str, Any]) -> dict[int, int]:
    """Default model width -> tiny width, over a config and its sub-configs (a text tower, a vision tower)."""
    found = {values[k]: SHRINK[k] for k in _WIDTHS if isinstance(values.get(k), int) and not isinstance(values[k], bool)}
    for value in values.values():
        if isinstance(value, dict):
            found = {**_widths(value), **found}
    return found


def _keep_ssm_heads(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Mamba-2 style SSM heads: ``num_heads * head_dim == expand * hidden_size`` (the inner width)."""
    if all(isinstance(values.get(k), int) for k in ("expand", "num_heads", "head_dim", "hidden_size")) and \
            values["num_heads"] * values["head_dim"] == values["expand"] * values["hidden_size"]:
        hidden, head_dim = out.get("hidden_size", values["hidden_size"]), out.get("head_dim", values["head_dim"])
        out["num_heads"] = max(1, values["expand"] * hidden // head_dim)


def _shrink_scalars(values: dict[str, Any]) -> dict[str, Any]:
    """The tiny values of one config's (or one layer's) scalar attributes, by name (:data:`SHRINK`, :data:`CAP`)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key == "tie_word_embeddings":
            out[key] = False
        elif key in SHRINK:
            if key == "head_dim" and value is None and "hidden_size" in values:
                out[key] = SHRINK[key]  # some attentions read head_dim even when the config leaves it None
                continue
            if key in _KV_HEADS and value is None and isinstance(values.get("num_attention_heads"), int):
                out[key] = SHRINK["num_attention_heads"]  # None: as many KV heads as heads (multi-head)
                continue
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # e.g. sliding_window=None (no window)
            out[key] = SHRINK[key]
            if key in _KV_HEADS:  # multi-query stays multi-query, multi-head stays multi-head
                heads = next((values[h] for h in _HEADS if isinstance(values.get(h), int)), None)
                out[key] = 1 if value == 1 else (SHRINK["num_attention_heads"] if value == heads else SHRINK[key])
        elif key in CAP and isinstance(value, int) and not isinstance(value, bool) and value > CAP[key]:
            out[key] = CAP[key]
        elif key.endswith("_token_id") and isinstance(value, int) and value >= SHRINK["vocab_size"]:
            out[key] = SHRINK["vocab_size"] - 1 - TOKEN_IDS.index(key) if key in TOKEN_IDS else SHRINK["vocab_size"] - 4
    _keep_mla_head(values, out)
    _keep_layer_periods(values, out)
    return out


def _keep_mla_head(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Multi-head latent attention: a ``head_dim`` that is the no-position + rotary part, or the rotary
    part alone, in the default stays so (the rotary embedding is built with ``head_dim``)."""
    mla = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")
    if not all(isinstance(values.get(k), int) for k in mla):
        return
    nope, rope = (out.get(k, values[k]) for k in mla[1:])
    if values["head_dim"] == values[mla[1]] + values[mla[2]]:
        out["head_dim"] = nope + rope
    elif values["head_dim"] == values[mla[2]]:
        out["head_dim"] = rope


def _keep_layer_periods(values: dict[str, Any], out: dict[str, Any]) -> None:
    """``<kind>_layer_period`` / ``<kind>_layer_offset`` (layer i is of the kind when i % period ==
    offset): period 2, offset 1 in the tiny stack, so that a 2-layer stack has a layer of each kind
    (Jamba's attention every 8th layer from the 4th is no layer at all in 2 layers)."""
    depth = next((out[k] for k in _DEPTHS if isinstance(out.get(k), int)), None)
    for key, value in values.items():
        if key.endswith("_layer_period") and isinstance(value, int) and depth is not None and value > depth:
            offset = key[: -len("period")] + "offset"
            out[key] = 2
            if isinstance(values.get(offset), int):
                out[offset] = 1


def _shrink_config(config, widths: dict[int, int] | None = None) -> dict[str, Any]:
    """The arguments that make ``config``'s class tiny: only what changes, only what the class takes
    (sub-configs recursively, as ``{"model_type": ..., **changes}``: they keep their own defaults)."""
    values = config.to_dict()
    widths = _widths(values) if widths is None else widths
    fields = _fields(config)
    aliases = getattr(config, "attribute_map", {}) or {}
    named = {real: alias for alias, real in aliases.items()  # not windows: Inkling's under an alias stays as it was
             if (alias in SHRINK or alias in CAP) and real not in SHRINK and real not in CAP and "window" not in real}
    out = _shrink_scalars({named.get(k, k): v for k, v in values.items()})  # num_experts_per_token: a top-k
    for key, value in values.items():
        sub = getattr(config, key, None) if isinstance(value, dict) and "model_type" in value else None
        if hasattr(sub, "to_dict"):
            out[key] = {"model_type": value["model_type"], **_shrink_config(sub, widths)}
    _shrink_layers(values, out)
    _keep_equal_sizes(values, out, widths)
    _keep_ssm_heads(values, out)
    if fields is not None:  # what the class takes, under its name or an alias; the shrink's own names
        taken = fields | set(aliases) | set(aliases.values())
        out = {k: v for k, v in out.items() if k in taken or k in ("model_type", "per_layer_config")}
    return {k: v for k, v in out.items() if k == "model_type" or v != values.get(k)}


def _merge(into: dict[str, Any], override: dict[str, Any]) -> None:
    """``override`` into ``into``, sub-config dicts merged key by key."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)  # the table stays as written


def tiny_config(model_type: str):
    """A tiny config of ``model_type``: hand-checked (.archs) if there is one, else generated."""
    from transformers import AutoConfig

    from superkernel.tools.models.archs import ARCHS

    hand = next((a for a in ARCHS.values() if a.model_type == model_type), None)
    if hand is not None:
        return hand.config()
    default = AutoConfig.for_model(model_type)
    kwargs = _shrink_config(default)
    kwargs.pop("model_type", None)
    _merge(kwargs, OVERRIDES.get(model_type, ({}, ""))[0])
    return AutoConfig.for_model(model_type, **kwargs)

def build_tiny(model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The tiny causal LM of ``model_type`` with seeded random weights, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        except AttributeError:
            cls, decoder = _decoder_sub_config(config)
            if decoder is None:
                raise
            torch.manual_seed(seed)
            model = cls._from_config(decoder, dtype=dtype)
    return model.eval().requires_grad_(False)


def _decoder_sub_config(config):
    """The sub-config the registered causal-LM class is written for, when the composite config is not
    (MusicGen's ``MusicgenForCausalLM`` takes the decoder's ``MusicgenDecoderConfig``, not the
    text-encoder + audio-encoder + decoder ``MusicgenConfig`` the auto mapping gives it): (class, sub-config
    or None)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, ""), None)
    wanted = getattr(cls, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return cls, None
    subs = [getattr(config, k) for k in getattr(config, "sub_configs", {}) if isinstance(getattr(config, k, None), wanted)]
    return cls, (subs[0] if len(subs) == 1 else None)


def save_tiny_checkpoint(model_type: str, directory, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Build the tiny ``model_type`` and write it as a Hugging Face checkpoint (config.json + safetensors)."""
    from pathlib import Path

    directory = Path(directory)
    build_tiny(model_type, seed=seed, dtype=dtype).save_pretrained(directory, safe_serialization=True)
    return directory


#: The CI subset of the generated sweep (tests/): one per failure class the issue found (full and
#: sliding attention are in tests/workflow/test_wf_sweep.py): a recurrent state cache (mamba), a
#: position bias sliced with an index computed from a tensor (mpt), learned absolute positions
#: with an offset and a growing mask (biogpt), a default mask built from the cache's length
#: (rembert, for the BERT-family decoders), state kept on the modules outside the cache
#: (recurrent_gemma). XLM (decoder layers as parallel lists) left it: passed its real cache
#: keyword, it cannot decode one token on a static cache (eligibility.EXPLAINED).
CI_SUBSET = ("mamba", "mpt", "biogpt", "rembert", "recurrent_gemma")
