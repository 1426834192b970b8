"""Scopes on vLLM's model classes by module path, put on the graph Dynamo traced.

vLLM compiles its model's forward itself (``@support_torch_compile`` on e.g. ``LlamaModel``), so superkernel
cannot wrap submodules before the trace without touching vLLM's code. Dynamo records, on every node, the stack
of modules it was traced in (``node.meta["nn_module_stack"]``: path and class); :func:`annotate` turns the
module path into the scope annotation ``super_kernel`` would have given (``node.meta["custom"]``), which
AOTAutograd carries into the ATen graph the backend segments.

Paths are read relative to the compiled module (``layers.3.self_attn``, ``layers.3.mlp``); a node outside every
matched module stays unscoped (the embedding, the final norm), except under ``full_model``.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch.fx as fx

from superkernel.ir.graph import ANNOTATION_KEY

#: the strategies, as in ``superkernel optimize`` (``moe``: the expert block, where a model has one)
STRATEGIES = ("attention", "mlp", "moe", "decoder_layer", "all_layers", "full_model")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.(.*))?$")
_ATTENTION = ("self_attn", "attn", "attention")
_MLP = ("mlp", "feed_forward")
_MOE = ("block_sparse_moe", "experts", "moe")


def module_path(raw: str) -> str:
    """Dynamo's path of a module (``L['self'].layers[3].mlp``, ``L['self']._modules['layers']._modules['3']``,
    ``getattr(L['self'].layers, '3')``) as a dotted path relative to the compiled module (``layers.3.mlp``)."""
    text = re.sub(r"getattr\((.*?),\s*'([^']*)'\)", r"\1.\2", raw)
    text = re.sub(r"\._modules\['([^']*)'\]", r".\1", text)
    text = re.sub(r"\[['\"]?([^\]'\"]*)['\"]?\]", r".\1", text)
    parts = [p for p in text.split(".") if p and p not in ("L", "self", "fn", "L.self")]
    return ".".join(parts)


def label_for(strategy: str, paths: list[str]) -> str | None:
    """The scope label of a node traced inside modules ``paths`` (outermost first), or None (unscoped)."""
    if strategy == "full_model":
        return "full_model"
    for path in reversed(paths):  # innermost first
        m = _LAYER.search(path)
        if m is None:
            continue
        index, rest = m.group(1), (m.group(2) or "")
        head = rest.split(".", 1)[0]
        if strategy == "decoder_layer":
            return f"decoder_layer_{index}"
        if strategy == "all_layers":
            return "all_layers"
        if strategy == "attention" and head in _ATTENTION:
            return f"attention_{index}"
        if strategy == "mlp" and head in _MLP:
            return f"mlp_{index}"
        if strategy == "moe" and head in _MOE:
            return f"moe_{index}"
    return None


def annotate(gm: fx.GraphModule, strategy: str, options: str = "") -> dict[str, int]:
    """Put ``strategy``'s scopes on Dynamo's graph ``gm`` in place; returns how many nodes each label got.
    A scope the model code set itself (``super_kernel`` inside the forward) is kept."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown vLLM scope strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        custom = node.meta.setdefault("custom", {})
        if ANNOTATION_KEY in custom:
            continue
        stack: dict[str, Any] = node.meta.get("nn_module_stack") or {}
        paths = [module_path(v[0] if isinstance(v, tuple) else str(v)) for v in stack.values()]
        label = label_for(strategy, paths)
        if label is None:
            continue
        custom[ANNOTATION_KEY] = {"scope": label, "options": options}
        counts[label] = counts.get(label, 0) + 1
    return counts


def annotator(strategy: str, options: str = "") -> Callable[[fx.GraphModule], dict[str, int]]:
    return lambda gm: annotate(gm, strategy, options)


__all__ = ["STRATEGIES", "annotate", "annotator", "label_for", "module_path"]
