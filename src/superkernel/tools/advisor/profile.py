"""Profiler-driven scope analysis: where the decode step spends its time, per module kind and layer.

The decode step runs under ``torch.profiler`` at the session's real shapes. Time is attributed
through the module hierarchy, not by guessing operator names: forward hooks on the modules
:func:`~superkernel.tools.advisor.structure.analyze_structure` found (embedding, each layer's
attention, MLP or MoE block and norms, the final norm, the LM head) open a
``record_function`` range named after the module path, and every profiler event is charged to
the innermost range around it. Times come from a second pass with the same hooks reading a wall
clock instead (the profiler's per-operator cost would inflate a launch-bound CPU step by more than
the step itself), averaged over the faster half of the profiled steps (a preempted step says
nothing about the model): exclusive module times plus "other" (everything outside the marked modules)
add up to that pass's step time, which :attr:`StepProfile.coverage` compares with the step
timed without hooks (interleaved with the hooked steps, the faster half of each). On CUDA the profiler's own CPU-side times are used (not run on hardware yet).

A compiled step (a plan) is profiled without hooks (Dynamo would trace them into the graph):
its time, operators and launches are measured as a whole.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from superkernel.tools.advisor.run_log import native_stderr_to
from superkernel.tools.advisor.structure import ModelStructure

KINDS = ("embedding", "attention", "moe", "mlp", "norm", "lm_head", "other")
#: The built-in strategy whose scopes cover a module of each kind (None: no built-in strategy does).
COVERING = {"attention": "attention", "mlp": "mlp", "moe": "moe", "norm": "decoder_layer / all_layers",
            "embedding": None, "lm_head": None, "other": None}
_MARK = "sk.module::"
_STEP = "sk.decode_step"


@dataclass
class ModuleRole:
    path: str
    kind: str
    layer: int | None


@dataclass
class KindRow:
    """Per step: one module kind in one layer (layer None: outside the layer stack)."""

    kind: str
    layer: int | None
    ms: float = 0.0
    ops: float = 0.0
    launches: float = 0.0
    weight_bytes: int = 0
    modules: list[str] = field(default_factory=list)

    @property
    def covered_by(self) -> str | None:
        return COVERING[self.kind]


@dataclass
class StepProfile:
    """One profiled decode step (averaged over the profiled steps)."""

    label: str                                        # "eager" or the plan's name
    step_ms: float                                    # profiled wall time per step
    measured_ms: float                                # unprofiled median of the same step, same process
    ops: float                                        # ATen operators per step (nested ones included)
    launches: float                                   # kernel launches per step (CPU: top-level ATen ops)
    steps: int
    rows: list[KindRow] = field(default_factory=list)  # empty for a compiled step
    module_ms: dict[str, float] = field(default_factory=dict)    # inclusive ms per profiled module path
    module_launches: dict[str, float] = field(default_factory=dict)
    weight_bytes: int = 0
    device: str = "cpu"

    @property
    def coverage(self) -> float:
        """Profiled step / unprofiled step: how closely the profile's time adds up to the real step."""
        return self.step_ms / self.measured_ms if self.measured_ms else float("nan")

    def kind_totals(self) -> dict[str, float]:
        out = dict.fromkeys(KINDS, 0.0)
        for r in self.rows:
            out[r.kind] += r.ms
        return out

    def top(self, n: int = 10) -> list[KindRow]:
        return sorted(self.rows, key=lambda r: -r.ms)[:n]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "step_ms": self.step_ms, "measured_ms": self.measured_ms,
                "coverage": self.coverage, "ops_per_step": self.ops, "launches_per_step": self.launches,
                "steps": self.steps, "weight_bytes": self.weight_bytes, "device": self.device,
                "kinds": {k: {"ms": v, "share": v / self.step_ms if self.step_ms else 0.0}
                          for k, v in self.kind_totals().items()} if self.rows else {},
                "rows": [{**asdict(r), "share": r.ms / self.step_ms if self.step_ms else 0.0,
                          "covered_by": r.covered_by} for r in self.rows]}


def module_roles(structure: ModelStructure) -> list[ModuleRole]:
    """The modules to mark, from the structure analysis (outermost first)."""
    roles = []
    if structure.embedding:
        roles.append(ModuleRole(structure.embedding, "embedding", None))
    for layer in structure.layers:
        roles.append(ModuleRole(layer.path, "other", layer.index))  # the layer's own glue: residual adds, Python
        if layer.attention:
            roles.append(ModuleRole(layer.attention, "attention", layer.index))
        if layer.ffn:
            roles.append(ModuleRole(layer.ffn, layer.ffn_kind or "mlp", layer.index))
        roles += [ModuleRole(n, "norm", layer.index) for n in layer.norms]
    if structure.final_norm:
        roles.append(ModuleRole(structure.final_norm, "norm", None))
    if structure.lm_head:
        roles.append(ModuleRole(structure.lm_head, "lm_head", None))
    return roles


def _read_fraction(model: torch.nn.Module, kind: str) -> float:
    """Share of a block's weights one token reads: MoE blocks read top-k of their experts."""
    if kind != "moe":
        return 1.0
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    k = getattr(text, "num_experts_per_tok", None)
    n = next((getattr(text, a) for a in ("num_experts", "num_local_experts", "n_routed_experts")
              if getattr(text, a, None)), None)
    return min(1.0, k / n) if k and n else 1.0


def weight_bytes(model: torch.nn.Module, roles: list[ModuleRole]) -> dict[str, int]:
    """Bytes of parameters one decode step reads per role module (each parameter counted once)."""
    out = {}
    seen: set[int] = set()
    for role in sorted(roles, key=lambda r: -r.path.count(".")):  # innermost first
        total = 0
        for p in model.get_submodule(role.path).parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        out[role.path] = int(total * _read_fraction(model, role.kind))
    return out


class _Marks:
    """Forward hooks around every role module (eager only).

    ``profiler=True``: a ``record_function`` range per module (operators and launches are
    charged to the innermost one). ``profiler=False``: wall-clock timestamps, so module
    times carry the hooks' cost only (the profiler's per-operator cost would inflate a
    launch-bound step); exclusive time = inclusive time - time in marked modules inside.
    """

    def __init__(self, model: torch.nn.Module, roles: list[ModuleRole], *, profiler: bool) -> None:
        self.handles = []
        self.stack: list[list] = []                      # [path, start, range or None, child seconds]
        self.inclusive: dict[str, float] = defaultdict(float)
        self.exclusive: dict[str, float] = defaultdict(float)
        self.profiler = profiler
        for role in roles:
            module = model.get_submodule(role.path)
            self.handles.append(module.register_forward_pre_hook(self._enter(role.path)))
            self.handles.append(module.register_forward_hook(self._exit, always_call=True))

    def _enter(self, path: str):
        def hook(module, args):
            rf = None
            if self.profiler:
                rf = torch.autograd.profiler.record_function(_MARK + path)
                rf.__enter__()
            self.stack.append([path, time.perf_counter(), rf, 0.0])
        return hook

    def _exit(self, module, args, output):
        if not self.stack:
            return
        path, start, rf, children = self.stack.pop()
        if rf is not None:
            rf.__exit__(None, None, None)
        took = time.perf_counter() - start
        self.inclusive[path] += took
        self.exclusive[path] += took - children
        if self.stack:
            self.stack[-1][3] += took

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _is_op(ev) -> bool:
    return ev.name.startswith("aten::") or ev.name.startswith("_c10d") or ev.name.startswith("prim::")


def _is_kernel(ev) -> bool:
    return ev.device_type != torch.autograd.DeviceType.CPU


def profile_step(session, step, *, structure: ModelStructure | None = None, label: str = "eager",
                 steps: int = 3, measured_ms: float | None = None, log=None) -> StepProfile:
    """Profile ``step`` (eager when ``structure`` is given: module ranges; else a compiled step).

    After one untimed call: ``steps`` steps timed per module (hooks and a wall clock), alternating,
    when ``measured_ms`` is None, with as many steps without hooks (what the profile is compared
    with, under the same load); then ``steps`` steps under ``torch.profiler`` (operators, launches).
    Both timings average the faster half of their steps.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    from superkernel.tools.decode import synchronize

    model = session.model
    roles = module_roles(structure) if structure is not None else []
    interleave = measured_ms is None
    steps = max(1, min(steps, (session.total_steps - 1) // (2 if interleave else 1)))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    session.restore_cache()
    times = []
    with torch.no_grad(), session.dynamo_config():
        step(*session.inputs(0))  # compile / warm caches, not profiled
        per_step: list[_Marks] = []
        bare: list[float] = []
        try:  # pass 1: wall clock per step and per module (hooks), alternating with steps without hooks
            for i in range(1, (2 * steps if interleave else steps) + 1):
                hooked = not interleave or i % 2 == 1
                if hooked:
                    per_step.append(_Marks(model, roles, profiler=False))
                synchronize(session.device)
                start = time.perf_counter()
                step(*session.inputs(i))
                synchronize(session.device)
                (times if hooked else bare).append(time.perf_counter() - start)
                if hooked:
                    per_step[-1].remove()
        finally:
            for marks in per_step:
                marks.remove()
        # The faster half of the steps: a step the OS preempted says nothing about the model.
        kept = _faster_half(times)
        timing = _Marks(model, [], profiler=False)
        for k in kept:
            for path, t in per_step[k].inclusive.items():
                timing.inclusive[path] += t
            for path, t in per_step[k].exclusive.items():
                timing.exclusive[path] += t
        session.restore_cache()  # the cache counts its own position: every pass starts after the prefill
        step(*session.inputs(0))
        marks = _Marks(model, roles, profiler=True)
        try:  # pass 2: operators and launches per module (torch.profiler)
            with native_stderr_to(log):  # the profiler's own start/stop lines
                with profile(activities=activities) as prof:
                    for i in range(1, steps + 1):
                        with record_function(_STEP):
                            step(*session.inputs(i))
                        synchronize(session.device)
        finally:
            marks.remove()
    session.restore_cache()
    step_ms = sum(times[k] for k in kept) / len(kept) * 1e3
    if measured_ms is None:  # the step without any hook, interleaved with the hooked ones (same load)
        measured_ms = sum(bare[k] for k in _faster_half(bare)) / len(_faster_half(bare)) * 1e3
    prof_view = _attribute(prof.events(), roles, weight_bytes(model, roles) if roles else {}, label, steps,
                           measured_ms, sum(p.numel() * p.element_size() for p in model.parameters()),
                           session.device.type)
    if session.device.type != "cuda":  # wall-clock times from pass 1 (on CUDA: the profiler's, see docs)
        _use_wall_times(prof_view, timing, roles, step_ms, len(kept))
    return prof_view


def _faster_half(times: list[float]) -> list[int]:
    return sorted(range(len(times)), key=times.__getitem__)[:max(1, (len(times) + 1) // 2)]


def _use_wall_times(view: "StepProfile", timing: _Marks, roles: list[ModuleRole], step_ms: float, steps: int) -> None:
    by_path = {r.path: r for r in roles}
    view.step_ms = step_ms
    view.module_ms = {p: t * 1e3 / steps for p, t in timing.inclusive.items()}
    for row in view.rows:
        row.ms = 0.0
    rows = {(r.kind, r.layer): r for r in view.rows}
    for path, t in timing.exclusive.items():
        role = by_path[path]
        row = rows.get((role.kind, role.layer))
        if row is None:
            row = rows[(role.kind, role.layer)] = KindRow(kind=role.kind, layer=role.layer, modules=[path])
            view.rows.append(row)
        row.ms += t * 1e3 / steps
    if view.rows:
        other = rows.get(("other", None))
        if other is None:
            other = rows[("other", None)] = KindRow(kind="other", layer=None)
            view.rows.append(other)
        other.ms = max(0.0, step_ms - sum(r.ms for r in view.rows if r is not other))


def _attribute(events, roles: list[ModuleRole], wbytes: dict[str, int], label: str, steps: int, measured_ms: float,
               total_bytes: int, device: str) -> StepProfile:
    by_path = {r.path: r for r in roles}
    step_us = 0.0
    ops = launches = 0
    kernels = 0
    self_us: dict[str | None, float] = defaultdict(float)      # innermost module path -> self time
    incl_us: dict[str, float] = defaultdict(float)
    op_count: dict[str | None, int] = defaultdict(int)
    launch_count: dict[str | None, int] = defaultdict(int)
    for ev in events:
        if _is_kernel(ev):
            kernels += 1
            continue
        chain = []
        parent = ev.cpu_parent
        while parent is not None:
            chain.append(parent)
            parent = parent.cpu_parent
        if ev.name == _STEP:
            step_us += ev.cpu_time_total
            self_us[None] += ev.self_cpu_time_total
            continue
        if not any(p.name == _STEP for p in chain):
            continue  # outside the profiled steps (profiler bookkeeping)
        owner = next((p.name[len(_MARK):] for p in chain if p.name.startswith(_MARK)), None)
        if ev.name.startswith(_MARK):
            path = ev.name[len(_MARK):]
            incl_us[path] += ev.cpu_time_total
            self_us[path] += ev.self_cpu_time_total
            continue
        self_us[owner] += ev.self_cpu_time_total
        if _is_op(ev):
            ops += 1
            op_count[owner] += 1
            if not any(_is_op(p) for p in chain):
                launches += 1
                launch_count[owner] += 1
    if device == "cuda":
        launches = kernels
    rows: dict[tuple[str, int | None], KindRow] = {}
    for path, us in self_us.items():
        role = by_path.get(path) if path is not None else None
        key = (role.kind, role.layer) if role else ("other", None)
        row = rows.setdefault(key, KindRow(kind=key[0], layer=key[1]))
        row.ms += us / 1e3 / steps
        row.ops += op_count.get(path, 0) / steps
        row.launches += launch_count.get(path, 0) / steps
        if role is not None:
            row.weight_bytes += wbytes.get(path, 0)
            row.modules.append(path)
    module_launches: dict[str, float] = defaultdict(float)
    for path in by_path:   # inclusive launches: a module's own plus those of modules inside it
        module_launches[path] = sum(c for p, c in launch_count.items()
                                    if p is not None and (p == path or p.startswith(path + "."))) / steps
    attributed = sum(wbytes.values())
    other = rows.get(("other", None))
    if other is not None:
        other.weight_bytes = max(0, total_bytes - attributed) if roles else total_bytes
    return StepProfile(label=label, step_ms=step_us / 1e3 / steps, measured_ms=measured_ms, ops=ops / steps,
                       launches=launches / steps, steps=steps,
                       rows=sorted(rows.values(), key=lambda r: (r.layer is None, r.layer or 0, KINDS.index(r.kind)))
                       if roles else [],
                       module_ms={p: us / 1e3 / steps for p, us in incl_us.items()},
                       module_launches=dict(module_launches), weight_bytes=total_bytes, device=device)
