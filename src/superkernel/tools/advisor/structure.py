"""Find the parts of a decoder-only model from its module tree.

No architecture table: roles are recognised from names and classes the way a
reader of the modeling code would (``self_attn``/``*Attention``, ``mlp``/``*MLP``,
MoE blocks by their ``experts`` and router children, ``*Norm``), so checkpoints
of other architectures get a useful answer too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
_FFN_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")
_ROUTER_NAMES = ("gate", "router")


@dataclass
class LayerParts:
    index: int
    path: str
    cls: str
    attention: str | None = None
    ffn: str | None = None
    ffn_kind: str | None = None          # "mlp" or "moe"
    router: str | None = None
    experts: str | None = None
    num_experts: int | None = None
    shared_experts: str | None = None
    norms: list[str] = field(default_factory=list)


@dataclass
class ModelStructure:
    architecture: str
    layers_path: str | None
    layers: list[LayerParts]
    attention_kind: str                  # "MLA", "GQA", "MHA" or "unknown"
    embedding: str | None = None
    final_norm: str | None = None
    lm_head: str | None = None
    classes: dict[str, str] = field(default_factory=dict)  # path -> class name of every role found
    #: No module per decoder layer, but parallel per-layer ModuleLists (XLM: ``attentions``,
    #: ``layer_norm1``, ``ffns``, ``layer_norm2``, entry *i* of each belonging to layer *i*):
    #: the lists' paths, and per layer the paths of its entries (see :func:`find_parallel_lists`).
    parallel_lists: list[str] = field(default_factory=list)
    parallel_layers: list[list[str]] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def stack_description(self) -> str:
        """Where the decoder layers are, for the analysis: ``4 at model.layers`` or the parallel lists."""
        if not self.layers and self.parallel_layers:
            return f"{len(self.parallel_layers)} as parallel lists {', '.join(self.parallel_lists)}"
        return f"{self.num_layers} at {self.layers_path}"

    @property
    def attention_paths(self) -> list[str]:
        return [p.attention for p in self.layers if p.attention]

    @property
    def mlp_paths(self) -> list[str]:
        return [p.ffn for p in self.layers if p.ffn and p.ffn_kind == "mlp"]

    @property
    def moe_paths(self) -> list[str]:
        return [p.ffn for p in self.layers if p.ffn and p.ffn_kind == "moe"]

    @property
    def layer_paths(self) -> list[str]:
        return [p.path for p in self.layers]

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_paths)


def _cls(module: torch.nn.Module) -> str:
    return type(module).__name__


def find_layer_stack(model: torch.nn.Module) -> tuple[str | None, torch.nn.ModuleList | None]:
    """The ModuleList of decoder layers: the longest list of same-class blocks that contain attention."""
    best: tuple[str | None, torch.nn.ModuleList | None] = (None, None)
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        if len({_cls(m) for m in module}) > 2:  # dense + MoE layer variants share a class in HF, allow one odd
            continue
        if not any(_find_attention(m) for m in module):
            continue
        if best[1] is None or len(module) > len(best[1]):
            best = (name, module)
    return best if best[1] is not None else _find_block_stack(model)


def _find_block_stack(model: torch.nn.Module) -> tuple[str | None, torch.nn.ModuleList | None]:
    """No stack has attention (Mamba, RWKV, xLSTM: a recurrent token mixer instead): the longest
    ModuleList of same-class ``...Block``/``...Layer`` modules that hold weights."""
    best: tuple[str | None, torch.nn.ModuleList | None] = (None, None)
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0 or len({_cls(m) for m in module}) > 2:
            continue
        if not all(_cls(m).endswith(("Block", "Layer")) and any(True for _ in m.parameters()) for m in module):
            continue
        if best[1] is None or len(module) > len(best[1]):
            best = (name, module)
    return best


def find_parallel_lists(model: torch.nn.Module) -> list[str]:
    """Sibling ModuleLists of one length, one of them of attention modules: a layer stack kept as
    parallel lists (XLM's ``attentions`` / ``ffns`` / norms) instead of one module per layer.

    Only asked when :func:`find_layer_stack` finds no stack; the lists in their definition order.
    """
    for _, parent in model.named_modules():
        lists = [(n, c) for n, c in parent.named_children() if isinstance(c, torch.nn.ModuleList) and len(c)]
        for name, stack in lists:
            if all("attention" in _cls(m).lower() for m in stack):
                prefix = next(n for n, m in model.named_modules() if m is parent)
                return [f"{prefix}.{n}" if prefix else n for n, c in lists if len(c) == len(stack)]
    return []


def _find_attention(layer: torch.nn.Module) -> str | None:
    for name, child in layer.named_children():
        if name in _ATTN_NAMES or "attention" in _cls(child).lower():
            return name
    return None


def _is_moe(module: torch.nn.Module) -> bool:
    names = dict(module.named_children())
    has_experts = "experts" in names or any("experts" in _cls(c).lower() and "shared" not in n for n, c in names.items())
    return has_experts or any(k in _cls(module).lower() for k in ("moe", "sparse"))


def _describe_layer(index: int, path: str, layer: torch.nn.Module) -> LayerParts:
    parts = LayerParts(index=index, path=path, cls=_cls(layer))
    for name, child in layer.named_children():
        full = f"{path}.{name}"
        cls = _cls(child).lower()
        if parts.attention is None and (name in _ATTN_NAMES or "attention" in cls):
            parts.attention = full
        elif "norm" in cls:
            parts.norms.append(full)
        elif parts.ffn is None and (name in _FFN_NAMES or any(k in cls for k in ("mlp", "moe", "sparse", "feedforward"))):
            parts.ffn = full
            parts.ffn_kind = "moe" if _is_moe(child) else "mlp"
            if parts.ffn_kind == "moe":
                _describe_moe(parts, full, child)
    return parts


def _describe_moe(parts: LayerParts, path: str, moe: torch.nn.Module) -> None:
    for name, child in moe.named_children():
        cls = _cls(child).lower()
        if "shared" in name or "shared" in cls:
            parts.shared_experts = f"{path}.{name}"
        elif name == "experts" or "experts" in cls:
            parts.experts = f"{path}.{name}"
            parts.num_experts = getattr(child, "num_experts", None) or (len(child) if isinstance(child, torch.nn.ModuleList) else None)
        elif name in _ROUTER_NAMES or "router" in cls or "gate" in cls:
            parts.router = f"{path}.{name}"


def _attention_kind(model: torch.nn.Module, layers: list[LayerParts]) -> str:
    cfg = getattr(model, "config", None)
    attn = layers[0].attention if layers else None
    if attn is not None:
        children = {n for n, _ in model.get_submodule(attn).named_children()}
        if {"kv_a_proj_with_mqa", "kv_b_proj"} & children or getattr(cfg, "kv_lora_rank", None):
            return "MLA"
    heads, kv_heads = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if heads:
        return "GQA" if kv_heads and kv_heads < heads else "MHA"
    return "unknown"


def analyze_structure(model: torch.nn.Module) -> ModelStructure:
    """Describe decoder layers, attention, MoE (router, experts, shared experts), dense MLPs and norms."""
    layers_path, stack = find_layer_stack(model)
    layers = [] if stack is None else [_describe_layer(i, f"{layers_path}.{i}", m) for i, m in enumerate(stack)]
    s = ModelStructure(architecture=_cls(model), layers_path=layers_path, layers=layers,
                       attention_kind=_attention_kind(model, layers))
    if not layers:
        s.parallel_lists = find_parallel_lists(model)
        depth = len(model.get_submodule(s.parallel_lists[0])) if s.parallel_lists else 0
        s.parallel_layers = [[f"{path}.{i}" for path in s.parallel_lists] for i in range(depth)]
    for name, module in model.named_modules():
        if not name or (layers_path and name.startswith(layers_path + ".")):
            continue
        if isinstance(module, torch.nn.Embedding) and s.embedding is None:
            s.embedding = name
        elif "norm" in _cls(module).lower() and name.count(".") <= 1:
            s.final_norm = name
        elif name in ("lm_head", "output", "embed_out"):
            s.lm_head = name
    for layer in layers:
        for path in (layer.path, layer.attention, layer.ffn, layer.router, layer.experts, layer.shared_experts, *layer.norms):
            if path:
                s.classes[path] = _cls(model.get_submodule(path))
    return s
