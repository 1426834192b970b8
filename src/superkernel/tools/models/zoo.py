"""The embedded model zoo: tiny Hugging Face architectures with seeded random weights.

Nothing is downloaded: each entry builds a ``transformers`` config with small
dimensions, and the weights come from the model's own initializer under a fixed
seed, so every run (and every process) sees the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: Sizes shared by the zoo: big enough for several layers and a real KV cache, small
#: enough that compiling and timing a dozen plans fits in minutes on a 2-core CPU.
_COMMON = dict(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
               max_position_embeddings=1024, tie_word_embeddings=False)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    architecture: str
    description: str
    make_config: Callable[[], object]


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(**_COMMON, intermediate_size=688, num_key_value_heads=4)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**_COMMON, intermediate_size=512, moe_intermediate_size=128, num_key_value_heads=4,
                          head_dim=32, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                          norm_topk_prob=True)


def _deepseek_v3():
    from transformers import DeepseekV3Config

    # Layer 0 stays dense (first_k_dense_replace=1) like the real model, the rest are MoE
    # with one shared expert; attention is MLA (low-rank q and compressed kv).
    return DeepseekV3Config(**_COMMON, intermediate_size=512, moe_intermediate_size=128, num_key_value_heads=8,
                            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                            n_group=2, topk_group=1, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                            qk_nope_head_dim=32, v_head_dim=32, rope_scaling=None)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("llama-tiny", "LlamaForCausalLM", "dense Llama: GQA attention + SwiGLU MLP, 4 layers", _llama),
        ZooEntry("qwen3-moe-tiny", "Qwen3MoeForCausalLM",
                 "Qwen3-MoE: GQA attention with q/k norm, 8 experts top-2 in every layer", _qwen3_moe),
        ZooEntry("deepseek-v3-tiny", "DeepseekV3ForCausalLM",
                 "DeepSeek-V3: MLA attention, dense layer 0, MoE (8 routed + 1 shared expert) after", _deepseek_v3),
    )
}

DEFAULT_MODEL = "llama-tiny"


def zoo_listing() -> str:
    """One line per zoo model, for error messages and --help."""
    return "; ".join(f"{e.name} ({e.description})" for e in ZOO.values())
