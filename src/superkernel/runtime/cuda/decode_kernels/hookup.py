"""The hookup: a covered Hugging Face Llama model decodes through the kernel set, one operator per layer.

    install(model, config)   # config: a CompilerConfig with experimental_config.cuda_decode_kernels on
    ... torch.compile / generate() with the superkernel backend in max-autotune ...
    remove(model)

Why at the module and not in the backend's graph: the backend sees an ATen graph per segment, where a Llama layer
is ~40 operators whose exact sequence changes with the transformers release, the attention implementation and the
mask code; matching it is brittle and a near-miss silently falls back. A decoder layer's forward, by contrast, says
what it is. :func:`install` checks the model once (``coverage.model_reason``; one warning naming the reason where it
is not covered, and nothing changes), then gives each decoder layer's instance a forward that, on a decode step
(batch 1, one token, a ``StaticCache``: ``coverage.step_reason``, decided from shapes while Dynamo traces), calls
``superkernel::llama_decode_layer`` (``op.py``) and otherwise runs the layer's own forward. The prefill is not a
decode step and runs as before, silently; any other uncovered step warns once per model with its reason.

Scopes wrap whatever ``forward`` a layer has, so ``apply_scopes`` after :func:`install` puts the operator inside the
layer's scope, and the step compiles to one CUDA graph with the set's six launches a layer where Inductor's kernels
were. The q, k and v weights are concatenated once here (a non-persistent buffer per layer: the prefill still reads
the separate projections, so the layer's q/k/v bytes are held twice); int8 weight-only layers (torchao) keep their
int8 rows and scales as plain tensors (``layer.int8_parts``), which the set's kernels read directly. Those are
taken at install: install after the weights are final (a later ``load_state_dict`` would not reach the concatenated
q/k/v copy; install again).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels import coverage

_HOOK_ATTR = "_superkernel_decode_kernels"
_ORIGINAL_ATTR = "_superkernel_decode_kernels_forward"
_HOOK_FN_ATTR = "_superkernel_decode_kernels_hook"
#: per-layer buffers the operator reads (non-persistent: not in the state dict)
_BUFFERS = ("w_qkv", "w_o", "w_gate", "w_up", "w_down", "s_qkv", "s_o", "s_gate", "s_up", "s_down")
_PREFIX = "_sk_dk_"
WARNING_PREFIX = "experimental_config.cuda_decode_kernels"


@dataclass
class Hookup:
    """What :func:`install` did: the layers it hooked, their weight kind, and the steps it declined (reasons)."""
    layers: int
    weights: str  # "bfloat16" or "int8-weight"
    declined: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = (f"decode kernel set: {self.layers} decoder layers hooked ({self.weights}), six launches each on a "
                "decode step of batch 1 (superkernel::llama_decode_layer)")
        if self.declined:
            text += "; steps left to Inductor: " + "; ".join(self.declined)
        return text


def hookup_of(model: Any) -> Hookup | None:
    """The :class:`Hookup` installed on ``model``, or None."""
    return getattr(model, _HOOK_ATTR, None)


def _model_device(model: Any) -> torch.device:
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def install(model: Any, config: Any, device: torch.device | str | None = None) -> Hookup | None:
    """Hook ``model``'s decoder layers to the kernel set when ``config`` asks for it (the flag on) and the model is
    covered; returns the :class:`Hookup`, or None (flag off: silently; not covered: with one warning naming the
    reason). Installing twice replaces the first."""
    if not config.experimental_config.cuda_decode_kernels:
        return None
    remove(model)
    device = torch.device(device) if device is not None else _model_device(model)
    reason = coverage.model_reason(model, mode=config.mode, device=device)
    if reason is not None:
        warnings.warn(f"{WARNING_PREFIX}: {type(model).__name__} decodes with Inductor's kernels: {reason}",
                      stacklevel=2)
        return None
    from superkernel.runtime.cuda.decode_kernels import op  # noqa: F401 (registers the operator)
    from superkernel.runtime.cuda.decode_kernels.layer import LayerWeights

    layers = coverage.decoder_layers(model)
    hookup = Hookup(layers=len(layers), weights="bfloat16")
    for index, layer in enumerate(layers):
        weights = LayerWeights.from_hf(layer)
        hookup.weights = "int8-weight" if weights.int8 else "bfloat16"
        for name in _BUFFERS:
            value = getattr(weights, name)
            layer.register_buffer(_PREFIX + name, value.detach() if value is not None else None, persistent=False)
        setattr(layer, _ORIGINAL_ATTR, layer.forward)
        layer.forward = _hooked_forward(layer, index, model.config, hookup)
        setattr(layer, _HOOK_FN_ATTR, layer.forward)
    setattr(model, _HOOK_ATTR, hookup)
    return hookup


def remove(model: Any) -> None:
    """Undo :func:`install` (nothing to do where it is not installed). Scopes applied after :func:`install` wrap the
    hooked forward: remove them first (``remove_scopes``), or this raises rather than drop them."""
    if hookup_of(model) is None:
        return
    layers = coverage.decoder_layers(model)
    wrapped = [i for i, layer in enumerate(layers)
               if hasattr(layer, _HOOK_FN_ATTR) and vars(layer).get("forward") is not getattr(layer, _HOOK_FN_ATTR)]
    if wrapped:
        raise RuntimeError(f"decode kernel hookup: layer(s) {wrapped} have another forward around the hooked one (a "
                           "scope?): remove_scopes(model) first, then remove the hookup")
    for layer in layers:
        if hasattr(layer, _HOOK_FN_ATTR):
            delattr(layer, _HOOK_FN_ATTR)
        if hasattr(layer, _ORIGINAL_ATTR):
            original = getattr(layer, _ORIGINAL_ATTR)
            delattr(layer, _ORIGINAL_ATTR)
            if getattr(original, "__self__", None) is layer and original.__func__ is type(layer).forward:
                del layer.forward  # the class's forward again
            else:
                layer.forward = original
        for name in _BUFFERS:
            if _PREFIX + name in layer._buffers:
                del layer._buffers[_PREFIX + name]
    delattr(model, _HOOK_ATTR)


def _hooked_forward(layer: Any, index: int, config: Any, hookup: Hookup) -> Any:
    original = layer.forward
    attn = layer.self_attn
    head_dim = getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n_q, n_kv = config.num_attention_heads, config.num_key_value_heads
    eps = float(layer.input_layernorm.variance_epsilon)
    sm_scale = float(getattr(attn, "scaling", head_dim ** -0.5))

    @functools.wraps(original)
    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        position_embeddings = kwargs.get("position_embeddings")
        cache_position = kwargs.get("cache_position")
        why = coverage.step_reason(hidden_states, cache, index, position_embeddings, cache_position)
        if why is not None:
            if why != coverage.NOT_A_DECODE_STEP and why not in hookup.declined:
                hookup.declined.append(why)
                warnings.warn(f"{WARNING_PREFIX}: a decode step runs on Inductor's kernels: {why}", stacklevel=2)
            return original(hidden_states, *args, **kwargs)
        cache_layer = coverage.cache_layer(cache, index)
        source = coverage.position_source(cache_layer, cache_position)
        pos = cache_layer.cumulative_length if source == "cumulative_length" else cache_position
        cos, sin = position_embeddings
        b = layer._buffers
        out = torch.ops.superkernel.llama_decode_layer(
            hidden_states, layer.input_layernorm.weight, b[_PREFIX + "w_qkv"], b[_PREFIX + "w_o"],
            layer.post_attention_layernorm.weight, b[_PREFIX + "w_gate"], b[_PREFIX + "w_up"], b[_PREFIX + "w_down"],
            b[_PREFIX + "s_qkv"], b[_PREFIX + "s_o"], b[_PREFIX + "s_gate"], b[_PREFIX + "s_up"],
            b[_PREFIX + "s_down"], cos, sin, pos, cache_layer.keys, cache_layer.values, n_q, n_kv, head_dim, eps,
            sm_scale)
        if source == "cumulative_length":
            cache_layer.cumulative_length.add_(1)  # as StaticLayer.update does: the next step writes one further
        return out

    return forward
