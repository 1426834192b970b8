"""Tiny configurations of many transformers decoder architectures, built on the fly.

Used by the architecture sweep (``benchmarks/hf_sweep.py``) and its CI subset in
``tests/``: every entry is a ``transformers`` config small enough (1-2 layers, hidden
size 64, vocabulary 256) to compile in seconds on a CPU, with seeded random weights from
the model's own initializer. Nothing is downloaded.

Each entry names what it exercises (``tags``): ``sliding`` (sliding-window layers),
``hybrid`` (layers of different kinds in one stack: sliding + full, or linear attention
+ full), ``chunked`` (chunked attention), ``moe``, ``mla``, ``parallel`` (parallel
residual), ``linear`` (linear attention / recurrent state), ``abs-pos`` (learned
absolute positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: Shared tiny sizes. Token ids are cleared: many configs default them outside a 256 vocabulary.
COMMON: dict[str, Any] = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                              tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)


@dataclass(frozen=True)
class Arch:
    name: str                          # sweep name
    model_type: str                    # transformers model_type
    overrides: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()         # COMMON keys this config does not take

    def config(self, **extra: Any):
        from transformers import AutoConfig

        kwargs = {k: v for k, v in COMMON.items() if k not in self.drop}
        kwargs.update(self.overrides)
        kwargs.update(extra)
        return AutoConfig.for_model(self.model_type, **kwargs)


_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "llama"),
    Arch("mistral", "mistral", dict(sliding_window=16), ("sliding",)),
    Arch("qwen2", "qwen2"),
    Arch("qwen3", "qwen3", dict(head_dim=16)),
    Arch("gemma", "gemma", dict(head_dim=16)),
    Arch("gemma2", "gemma2", dict(head_dim=16, sliding_window=16), ("sliding", "hybrid")),
    Arch("gemma3_text", "gemma3_text", dict(head_dim=16, sliding_window=16, num_hidden_layers=2,
                                            layer_types=["sliding_attention", "full_attention"]),
         ("sliding", "hybrid")),
    Arch("cohere2", "cohere2", dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
         ("sliding", "hybrid")),
    Arch("mixtral", "mixtral", dict(num_local_experts=4, num_experts_per_tok=2), ("moe",)),
    Arch("qwen2_moe", "qwen2_moe", dict(_MOE, shared_expert_intermediate_size=32), ("moe",)),
    Arch("qwen3_moe", "qwen3_moe", dict(_MOE, head_dim=16), ("moe",)),
    Arch("olmoe", "olmoe", dict(num_experts=4, num_experts_per_tok=2), ("moe",)),
    Arch("phimoe", "phimoe", dict(num_local_experts=4, num_experts_per_tok=2), ("moe",)),
    Arch("deepseek_v3", "deepseek_v3", dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                                            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                                            moe_intermediate_size=32, kv_lora_rank=32, q_lora_rank=48,
                                            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                            rope_scaling=None), ("mla", "moe")),
    Arch("gpt_neox", "gpt_neox", dict(rotary_pct=0.5), ("parallel",)),
    Arch("phi", "phi", dict(partial_rotary_factor=0.5), ("parallel",)),
    Arch("phi3", "phi3"),
    Arch("opt", "opt", dict(ffn_dim=128, word_embed_proj_dim=64, num_attention_heads=4),
         ("abs-pos",), drop=("num_key_value_heads", "intermediate_size")),
    Arch("gpt2", "gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=128), ("abs-pos",),
         drop=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "max_position_embeddings")),
    Arch("falcon", "falcon", dict(new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True),
         ("parallel",), drop=("num_key_value_heads", "intermediate_size")),
    Arch("olmo2", "olmo2"),
    Arch("granite", "granite"),
    Arch("starcoder2", "starcoder2", dict(sliding_window=None)),
    Arch("cohere", "cohere", {}, ("parallel",)),
    Arch("stablelm", "stablelm"),
    Arch("smollm3", "smollm3"),
    Arch("llama4_text", "llama4_text", dict(head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                                            intermediate_size_mlp=128, attention_chunk_size=16,
                                            interleave_moe_layer_step=2, no_rope_layers=[1, 0]),
         ("chunked", "hybrid", "moe")),
    Arch("qwen3_next", "qwen3_next", dict(head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                                          linear_value_head_dim=16, linear_num_key_heads=2,
                                          linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                          layer_types=["linear_attention", "full_attention"]),
         ("linear", "hybrid", "moe")),
)}

#: The fast CI subset of the sweep (tests/): one per family that broke before.
CI_SUBSET = ("mistral", "opt")


def build(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, **config_overrides: Any) -> torch.nn.Module:
    """The named tiny architecture with seeded random weights, in eval mode."""
    from transformers import AutoModelForCausalLM

    arch = ARCHS[name]
    config = arch.config(**config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def save_checkpoint(name: str, directory: Path | str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                    **config_overrides: Any) -> Path:
    """Build the tiny model and write it as a Hugging Face checkpoint (config.json + safetensors)."""
    directory = Path(directory)
    model = build(name, seed=seed, dtype=dtype, **config_overrides)
    model.save_pretrained(directory, safe_serialization=True)
    return directory
