"""Which models, steps and dtypes the decode kernel set covers, and why not where it does not.

Pure decisions, no Triton and no transformers import (they run in ``make test``): the hookup (``hookup.py``) asks
:func:`model_reason` once when it is installed and :func:`step_reason` at every traced call of a layer; a reason is
a sentence naming what is not covered, ``None`` means covered. Everything not covered keeps Inductor's kernels.

Covered: a Hugging Face Llama decoder (``model_type`` llama: Llama 2/3.x, SmolLM2, TinyLlama, ...) whose layers
are RMSNorm -> q/k/v projections without bias -> rotary (``rotate_half``, any rope scaling: the model's own rotary
module computes cos/sin) -> attention over a static cache -> o projection + residual -> RMSNorm -> SiLU-gated MLP
without bias -> residual; bfloat16 weights, or int8 weight-only per channel (torchao) with bfloat16 activations; in
max-autotune on CUDA (or on the CPU under Triton's interpreter, ``TRITON_INTERPRET=1``: how the CPU checks it); a
step of batch 1 and one new token over a ``StaticCache``. The prompt's prefill is not a decode step: it runs as
before, without a warning.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels import triton_available

#: ``config.model_type`` values whose decoder layers have the structure above
MODEL_TYPES = ("llama",)
#: a decode step of one token: anything else (the prefill) is not the kernel set's job, and no warning is given
NOT_A_DECODE_STEP = "not a decode step (more than one token: the prefill)"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _weight_kind(weight: Any) -> str:
    """``bfloat16``, ``int8-weight`` (torchao's per-channel int8 weight-only tensor) or what else it is."""
    qdata = getattr(weight, "qdata", None)
    if qdata is not None:
        block = list(getattr(weight, "block_size", []))
        if qdata.dtype == torch.int8 and len(block) == 2 and block[0] == 1 and block[1] == weight.shape[-1]:
            return "int8-weight"
        return f"{type(weight).__name__} ({qdata.dtype}, block {block})"
    return str(weight.dtype).replace("torch.", "")


def layer_reason(layer: Any) -> str | None:
    """Why a decoder layer is not a Llama layer the set runs, or None."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    needed = {"self_attn": attn, "mlp": mlp, "input_layernorm": getattr(layer, "input_layernorm", None),
              "post_attention_layernorm": getattr(layer, "post_attention_layernorm", None)}
    missing = [k for k, v in needed.items() if v is None]
    if missing:
        return f"{type(layer).__name__} has no {', '.join(missing)}"
    projections = {f"self_attn.{n}": getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    projections.update({f"mlp.{n}": getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")})
    missing = [k for k, v in projections.items() if getattr(v, "weight", None) is None]
    if missing:
        return f"{type(layer).__name__} has no {', '.join(missing)} weight"
    biased = [k for k, v in projections.items() if getattr(v, "bias", None) is not None]
    if biased:
        return f"projections with a bias ({', '.join(biased)}): the set's GEMVs have none"
    extra = [n for n in ("q_norm", "k_norm", "sliding_window") if getattr(attn, n, None) is not None]
    if extra:
        return f"attention with {', '.join(extra)}: not in the set"
    kinds = {k: _weight_kind(v.weight) for k, v in projections.items()}
    if len(set(kinds.values())) != 1:
        return f"projections of mixed kinds ({', '.join(sorted(set(kinds.values())))}): the set takes one per layer"
    kind = next(iter(kinds.values()))
    if kind not in ("bfloat16", "int8-weight"):
        return f"weights in {kind}: the set runs bfloat16 weights or int8 weight-only (bfloat16 activations)"
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = needed[name]
        if getattr(norm, "weight", None) is None or not hasattr(norm, "variance_epsilon"):
            return f"{name} is not an RMSNorm with a weight ({type(norm).__name__})"
        if norm.weight.dtype != torch.bfloat16:
            return f"{name} weight in {norm.weight.dtype}: the set runs bfloat16"
    return None


def model_reason(model: Any, *, mode: str, device: torch.device | str) -> str | None:
    """Why ``model`` cannot decode through the set in ``mode`` on ``device``, or None."""
    device = torch.device(device)
    if mode != "max-autotune":
        return f"the kernel set is part of max-autotune, and the plan's mode is {mode}"
    if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
        return f"the kernel set runs on CUDA (Triton); the model is on {device.type}"
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return (f"model type {model_type!r}: the set covers Llama-style decoders ({', '.join(MODEL_TYPES)}) "
                f"and this is {type(model).__name__}")
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"MLP activation {config.hidden_act!r}: the set's gate/up kernel is SiLU-gated"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"pretraining_tp={config.pretraining_tp}: the projections are split, the set reads them whole"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim % 2:
        return f"head_dim {head_dim} is odd: the rotary pairs d with d + D/2"
    if config.num_attention_heads % config.num_key_value_heads:
        return "query heads not a multiple of the key/value heads"
    layers = decoder_layers(model)
    if not layers:
        return f"{type(model).__name__} has no model.layers"
    for i, layer in enumerate(layers):
        why = layer_reason(layer)
        if why is not None:
            return f"layer {i}: {why}"
    if not triton_available():  # (last: the decisions above are checked where Triton is not installed)
        return "Triton is not importable in this process"
    return None


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers``), or []."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def cache_layer(cache: Any, layer_idx: int) -> Any:
    layers = getattr(cache, "layers", None)
    return layers[layer_idx] if layers is not None and layer_idx < len(layers) else None


def position_source(layer: Any, cache_position: Any) -> str | None:
    """Where a step's write position lives on the device: the cache layer's ``cumulative_length`` (transformers
    5.24: ``StaticLayer.update`` writes there and advances it), else the ``cache_position`` the model hands its
    layers (earlier releases); None when neither is a tensor."""
    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        return "cumulative_length"
    if isinstance(cache_position, torch.Tensor) and cache_position.numel() == 1:
        return "cache_position"
    return None


def step_reason(hidden_states: torch.Tensor, cache: Any, layer_idx: int, position_embeddings: Any,
                cache_position: Any = None) -> str | None:
    """Why one call of a covered layer is not a step the set runs (:data:`NOT_A_DECODE_STEP` for the prefill), or
    None. Shapes and types only: what Dynamo specializes on, so the answer holds for the traced graph."""
    if hidden_states.dim() != 3 or hidden_states.shape[1] != 1:
        return NOT_A_DECODE_STEP
    if hidden_states.shape[0] != 1:
        return f"batch {hidden_states.shape[0]}: the set decodes batch 1"
    if hidden_states.dtype != torch.bfloat16:
        return f"activations in {hidden_states.dtype}: the set runs bfloat16"
    layer = cache_layer(cache, layer_idx)
    if layer is None:
        return f"no cache layer {layer_idx} (the set writes K and V into a StaticCache)"
    if type(layer).__name__ != "StaticLayer":
        return f"a {type(layer).__name__} cache: the set writes K and V into a StaticCache (StaticLayer)"
    if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
        return "the static cache is not initialized yet (no prefill ran)"
    if position_source(layer, cache_position) is None:
        return "no device-side write position (a StaticLayer.cumulative_length or a cache_position tensor)"
    if layer.keys.shape[0] != 1 or layer.keys.dtype != torch.bfloat16:
        return f"a static cache of batch {layer.keys.shape[0]} in {layer.keys.dtype}: the set runs batch 1 bfloat16"
    if not (isinstance(position_embeddings, (tuple, list)) and len(position_embeddings) == 2):
        return "no rotary cos/sin handed to the layer (position_embeddings)"
    return None
