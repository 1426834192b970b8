"""Tensor parallelism on plain tensors: shard a model by a transformers-style ``tp_plan``.

The plan is the one transformers ships with the model (``model.tp_plan``: the config's
``base_model_tp_plan`` plus the class's ``_tp_plan``) or one the user gives for a
hand-written model: ``{module or parameter glob: style}``, ``*`` matching one path
component. Every rank keeps its shard as an ordinary tensor and the collectives are
functional ones (``torch.distributed._functional_collectives``) called from forward hooks,
so Dynamo traces them into the decode graph like any other operator and the superkernel
backend sees them inside the scopes.

Why not transformers' own ``DistributedConfig`` sharding: it keeps every parameter as a
DTensor and swaps it for its local shard on each forward. Measured on llama-tiny, 2 gloo
ranks on a 2-core CPU: eager 49 ms per decode step and 120 s to compile one plan, against
a few ms and seconds here (docs/distributed.md). The plan and the arithmetic are the same.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

#: Styles this module realizes, with what each does on rank r of N.
STYLES = {
    "colwise": "Linear: rows of the weight (output features) split; output stays split",
    "rowwise": "Linear or a 3-D expert weight: the input dim split; a Linear's output is all-reduced, bias added once",
    "colwise_gather_output": "Linear: output features split, the output all-gathered (the LM head)",
    "colwise_rep": "same as colwise_gather_output",
    "rowwise_rep": "same as rowwise for a Linear",
    "packed_colwise": "3-D expert gate_up weight [E, 2I, H]: each half (gate, up) split along I",
    "moe_tp_experts": "experts module: its output (a partial sum over the split I) is all-reduced",
    "embedding_rowwise": "Embedding: the vocabulary split; out-of-shard ids read zeros, the rows all-reduced",
    "replicated_with_grad_allreduce": "replicated (only training differs)",
    "replicate": "replicated",
}
_NO_OP = {"replicated_with_grad_allreduce", "replicate"}


class TensorParallelError(ValueError):
    """A plan that cannot be applied (unknown style, a glob matching nothing, an uneven split)."""


@dataclass
class Sharded:
    """What :func:`apply_tensor_parallel` did: one entry per sharded module or parameter."""

    world_size: int
    rank: int
    applied: dict[str, str] = field(default_factory=dict)   # path -> style
    unmatched: list[str] = field(default_factory=list)      # rules of the model's own plan naming nothing here
    collectives: int = 0                                    # collective hooks installed

    @property
    def layout(self) -> str:
        return f"tp{self.world_size}"


def model_plan(model: torch.nn.Module) -> dict[str, str]:
    """The tensor-parallel plan transformers defines for ``model`` (empty when it has none)."""
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, Mapping) and plan:
        return dict(plan)
    base = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    return {(f"{prefix}.{k}" if prefix else k): v for k, v in base.items()}


def _matches(pattern: str, name: str) -> bool:
    want, parts = pattern.split("."), name.split(".")
    return len(want) == len(parts) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, want))


def _split(tensor: torch.Tensor, dim: int, world: int, rank: int, what: str) -> torch.Tensor:
    size = tensor.shape[dim]
    if size % world:
        raise TensorParallelError(f"{what}: dimension {dim} has size {size}, not divisible by {world} ranks")
    return tensor.narrow(dim, rank * (size // world), size // world).contiguous()


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    from torch.distributed import _functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_reduce(t, "sum", group))


def _all_gather_last(t: torch.Tensor, group) -> torch.Tensor:
    from torch.distributed import _functional_collectives as funcol

    # Gathered along dim 0 and laid out here: torch 2.11 (the GPU machines') has no all_gather_single, and its
    # all_gather_tensor along another dim calls a helper Dynamo will not trace (a graph break in every step)
    t = t.contiguous()
    gathered = funcol.wait_tensor(funcol.all_gather_tensor(t, 0, group))  # [world * d0, ..., n]
    world = gathered.shape[0] // t.shape[0]
    return gathered.view(world, *t.shape).movedim(0, -2).reshape(*t.shape[:-1], world * t.shape[-1])


def _set_param(owner: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    setattr(owner, name, torch.nn.Parameter(value, requires_grad=False))


def _shard_linear_rowwise(module: torch.nn.Linear, world: int, rank: int, group, path: str) -> None:
    _set_param(module, "weight", _split(module.weight.data, 1, world, rank, path))
    module.in_features //= world
    bias = module.bias
    if bias is not None:  # added once, after the sum
        module.bias = None
        module.register_buffer("tp_bias", bias.data.clone(), persistent=False)

    def reduce(mod, args, out):
        out = _all_reduce(out, group)
        return out + mod.tp_bias if getattr(mod, "tp_bias", None) is not None else out

    module.register_forward_hook(reduce)


def _shard_embedding(module: torch.nn.Embedding, world: int, rank: int, group, path: str) -> None:
    rows = module.weight.shape[0]
    _set_param(module, "weight", _split(module.weight.data, 0, world, rank, path))
    n = rows // world
    # the shard's first row is a buffer, not a Python int: the traced graph (and its compiled
    # kernels, which a static package shares between ranks) is then the same on every rank
    module.register_buffer("tp_offset", torch.tensor(rank * n, device=module.weight.device), persistent=False)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        lo = module.tp_offset
        inside = (ids >= lo) & (ids < lo + n)
        local = F.embedding((ids - lo).clamp(0, n - 1), module.weight)
        return _all_reduce(local * inside.unsqueeze(-1).to(local.dtype), group)

    module.forward = forward


def _apply_one(path: str, style: str, owner: torch.nn.Module, leaf: str | None, world: int, rank: int,
               group, out: Sharded) -> None:
    target = getattr(owner, leaf) if leaf else owner
    kind = type(target).__name__
    if style in _NO_OP:
        return
    if isinstance(target, torch.nn.Linear) and style == "colwise":
        _set_param(target, "weight", _split(target.weight.data, 0, world, rank, path))
        if target.bias is not None:
            _set_param(target, "bias", _split(target.bias.data, 0, world, rank, path))
        target.out_features //= world
    elif isinstance(target, torch.nn.Linear) and style in ("colwise_gather_output", "colwise_rep"):
        _set_param(target, "weight", _split(target.weight.data, 0, world, rank, path))
        if target.bias is not None:
            _set_param(target, "bias", _split(target.bias.data, 0, world, rank, path))
        target.register_forward_hook(lambda mod, args, y: _all_gather_last(y, group))
        out.collectives += 1
    elif isinstance(target, torch.nn.Linear) and style in ("rowwise", "rowwise_rep"):
        _shard_linear_rowwise(target, world, rank, group, path)
        out.collectives += 1
    elif isinstance(target, torch.nn.Parameter) and style == "rowwise" and target.dim() == 3:
        _set_param(owner, leaf, _split(target.data, 2, world, rank, path))
    elif isinstance(target, torch.nn.Parameter) and style == "packed_colwise" and target.dim() == 3:
        e, two_i, h = target.shape
        halves = target.data.reshape(e, 2, two_i // 2, h)
        _set_param(owner, leaf, _split(halves, 2, world, rank, path).reshape(e, two_i // world, h))
    elif isinstance(target, torch.nn.Module) and style == "moe_tp_experts":
        target.register_forward_hook(lambda mod, args, y: _all_reduce(y, group))
        out.collectives += 1
    elif isinstance(target, torch.nn.Embedding) and style == "embedding_rowwise":
        _shard_embedding(target, world, rank, group, path)
        out.collectives += 1
    else:
        raise TensorParallelError(f"tensor-parallel plan: style {style!r} on {path!r} ({kind}) is not supported; "
                                  f"supported: {', '.join(STYLES)} (Linear, Embedding, 3-D expert weights)")
    out.applied[path] = style


def apply_tensor_parallel(model: torch.nn.Module, plan: Mapping[str, str] | None = None, *,
                          group=None, strict: bool | None = None) -> Sharded:
    """Shard ``model`` in place for this rank of ``group`` (default: the whole job).

    ``plan`` None: the model's own transformers plan (:func:`model_plan`), whose rules may
    name modules a given configuration lacks (a dense MLP in an all-MoE model): those are
    skipped and listed in ``Sharded.unmatched`` (``strict`` False, as transformers does).
    In a given plan (``strict`` True by default) a glob that
    matches nothing, an unknown style or a size that does not divide by the world size
    raises :class:`TensorParallelError`; globs and styles are checked before anything
    changes, sizes as each weight is split (call it on a freshly loaded model).
    """
    if not dist.is_initialized():
        raise TensorParallelError("apply_tensor_parallel needs torch.distributed initialized (run under "
                                  "superkernel --nproc N or torchrun)")
    if strict is None:
        strict = plan is not None
    plan = dict(model_plan(model) if plan is None else plan)
    if not plan:
        raise TensorParallelError(f"{type(model).__name__} has no tensor-parallel plan; give one "
                                  "({module or parameter glob: style}) with --tp-plan FILE")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    group = group if group is not None else dist.group.WORLD
    unknown = sorted({s for s in plan.values() if s not in STYLES})
    if unknown:
        raise TensorParallelError(f"tensor-parallel plan: unknown style(s) {', '.join(unknown)}; "
                                  f"supported: {', '.join(STYLES)}")
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    todo: list[tuple[str, str, torch.nn.Module, str | None]] = []
    unmatched = []
    for pattern, style in plan.items():
        hits = [(n, modules[n.rpartition(".")[0]], n.rpartition(".")[2]) for n in params if _matches(pattern, n)]
        hits += [(n, m, None) for n, m in modules.items() if n and _matches(pattern, n)]
        if not hits and not strict:
            unmatched.append(pattern)
            continue
        if not hits:
            raise TensorParallelError(f"tensor-parallel plan: {pattern!r} matches no module or parameter of "
                                      f"{type(model).__name__}")
        todo += [(n, style, owner, leaf) for n, owner, leaf in hits]
    out = Sharded(world_size=world, rank=rank, unmatched=unmatched)
    if world == 1:
        return out
    for path, style, owner, leaf in todo:
        _apply_one(path, style, owner, leaf, world, rank, group, out)
    return out
