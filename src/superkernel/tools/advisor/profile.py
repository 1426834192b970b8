"""Profiler-driven scope analysis: where the decode step spends its time, per module kind and layer.

The decode step runs under ``torch.profiler`` at the session's real shapes. Time is attributed
through the module hierarchy, not by guessing operator names: wrappers around the ``forward`` of the modules
:func:`~superkernel.tools.advisor.structure.analyze_structure` found (embedding, each layer's
attention, MLP or MoE block and norms, the final norm, the LM head) open a
``record_function`` range named after the module path, and every profiler event is charged to
the innermost range around it. Times come from a second pass with the same wrappers reading a wall
clock instead (the profiler's per-operator cost would inflate a launch-bound CPU step by more than
the step itself; on one CPU thread the thread's CPU time, see :func:`step_clock`), averaged over the fastest quarter of the profiled steps, taken over several
rounds of the same positions (a preempted step says nothing about the model): exclusive module times plus "other" (everything outside the marked modules)
add up to that pass's step time, which :attr:`StepProfile.coverage` compares with the step
timed without hooks (rounds with and without hooks alternate, the fastest quarter of each). The
wrappers' own cost per marked call is measured inside the model (:func:`in_model_cost`, on
calibration rounds that alternate with the profiled ones) and taken out of the callers' times. On CUDA the profiler's own CPU-side times are used (not run on hardware yet).

A compiled step (a plan) is profiled without wrappers (Dynamo would trace them into the graph):
its time, operators and launches are measured as a whole.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from superkernel.tools.advisor.profile_rounds import Round, enough_rounds, in_model_cost, profile_pairs
from superkernel.tools.advisor.run_log import native_stderr_to
from superkernel.tools.advisor.structure import ModelStructure

KINDS = ("embedding", "attention", "moe", "mlp", "norm", "lm_head", "other")
#: The built-in strategy whose scopes cover a module of each kind (None: no built-in strategy does).
COVERING = {"attention": "attention", "mlp": "mlp", "moe": "moe", "norm": "decoder_layer / all_layers",
            "embedding": None, "lm_head": None, "other": None}
_MARK = "sk.module::"
#: Rounds of the wall-clock pass over the same positions: at least MIN_ROUNDS, more (up to
#: MAX_ROUNDS) until MIN_TIMED_S seconds were timed, so a short step has enough samples to
#: keep only unpreempted ones. Eager (wrapped and bare rounds; a quarter of them calibrate the
#: wrappers' cost, see :mod:`~superkernel.tools.advisor.profile_rounds`; fewer than 48 rounds
#: left tiny models' coverage up to 15 % off under a load of 2-3 on 2 cores) ...
#: Past the minimum, the pass goes on until the calibration and the profile are each known to
#: 2.5 % of the step (:func:`~superkernel.tools.advisor.profile_rounds.settled`; 1.5 % took up
#: to 128 rounds, 25 s on llama-tiny, under a load of 4.5 on 2 cores). A long step stops sooner, by
#: time (:func:`~superkernel.tools.advisor.profile_rounds.enough_rounds`).
MIN_ROUNDS, MAX_ROUNDS, MIN_TIMED_S = 48, 96, 1.5
#: ... and a compiled step (no wrappers, nothing to compare).
MIN_ROUNDS_COMPILED, MAX_ROUNDS_COMPILED, MIN_TIMED_S_COMPILED = 4, 16, 0.5
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
    wrapper_us: float = 0.0                           # wrappers' cost per marked call, taken out (in-model)
    marked_calls: float = 0.0                         # marked module calls per step

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
                "wrapper_us_per_call": self.wrapper_us, "marked_calls_per_step": self.marked_calls,
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
    """Timing wrappers around every role module's ``forward`` (eager only).

    ``profiler=True``: a ``record_function`` range per module (operators and launches are
    charged to the innermost one). ``profiler=False``: wall-clock timestamps, so module
    times carry the hooks' cost only (the profiler's per-operator cost would inflate a
    launch-bound step); exclusive time = inclusive time - time in marked modules inside.
    It also counts the marked calls (all, directly inside each module, nested inside each
    module): the hooks' own cost per call is charged to the caller, see :func:`hook_cost`.
    """

    def __init__(self, model: torch.nn.Module, roles: list[ModuleRole], *, profiler: bool,
                 clock=time.perf_counter) -> None:
        self.handles = []
        self.clock = clock
        self.stack: list[list] = []          # [path, start, range or None, child seconds, nested calls]
        self.inclusive: dict[str, float] = defaultdict(float)
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls = 0                                          # marked calls in all
        self.direct: dict[str, int] = defaultdict(int)          # marked calls directly inside a module
        self.nested: dict[str, int] = defaultdict(int)          # marked calls anywhere inside a module
        self.profiler = profiler
        wrapped: set[int] = set()
        for role in roles:  # a module shared under two paths is wrapped once (its first path)
            module = model.get_submodule(role.path)
            if id(module) not in wrapped:
                wrapped.add(id(module))
                self._wrap(module, role.path)

    def _wrap(self, module: torch.nn.Module, path: str) -> None:
        """Time ``module`` by wrapping its ``forward`` (an instance attribute, restored by :meth:`remove`).

        Not forward hooks: a module with hooks leaves ``Module.__call__``'s fast path, which
        costs 10-30 us per call inside a real model (measured: +12 % on llama-tiny's step), far
        more than the few us of a wrapper that keeps the fast path.
        """
        had_own = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        inner = module.forward
        enter, leave = self._enter, self._exit

        def timed_forward(*args: Any, **kwargs: Any) -> Any:
            enter(path)
            try:
                return inner(*args, **kwargs)
            finally:
                leave()

        module.forward = timed_forward

        def restore() -> None:
            if had_own:
                module.forward = previous
            else:
                module.__dict__.pop("forward", None)
        self.handles.append(restore)

    def _enter(self, path: str) -> None:
        rf = None
        if self.profiler:
            rf = torch.autograd.profiler.record_function(_MARK + path)
            rf.__enter__()
        self.stack.append([path, self.clock(), rf, 0.0, 0])

    def _exit(self) -> None:
        if not self.stack:
            return
        path, start, rf, children, nested = self.stack.pop()
        if rf is not None:
            rf.__exit__(None, None, None)
        took = self.clock() - start
        self.inclusive[path] += took
        self.exclusive[path] += took - children
        self.nested[path] += nested
        self.calls += 1
        if self.stack:
            self.stack[-1][3] += took
            self.stack[-1][4] += nested + 1
            self.direct[self.stack[-1][0]] += 1

    def reset(self) -> None:
        self.inclusive, self.exclusive = defaultdict(float), defaultdict(float)
        self.direct, self.nested, self.calls = defaultdict(int), defaultdict(int), 0

    def take(self) -> "_Marks":
        """This step's times and counts (as a detached record); starts counting anew."""
        record = _Marks(torch.nn.Module(), [], profiler=False)
        record.add(self)
        self.reset()
        return record

    def add(self, other: "_Marks") -> None:
        """Sum another step's times and counts into this one."""
        for path, t in other.inclusive.items():
            self.inclusive[path] += t
        for path, t in other.exclusive.items():
            self.exclusive[path] += t
        for path, n in other.direct.items():
            self.direct[path] += n
        for path, n in other.nested.items():
            self.nested[path] += n
        self.calls += other.calls

    def discount(self, cost: float) -> float:
        """Take ``cost`` seconds per marked call out of the times; returns the seconds taken in all.

        A call's hook cost (dispatch into the hooks, their bookkeeping) lies outside its own
        interval, in its caller's: each module's exclusive time loses its direct marked calls'
        cost, its inclusive time the cost of every marked call inside it.
        """
        for path in self.exclusive:
            self.exclusive[path] = max(0.0, self.exclusive[path] - cost * self.direct.get(path, 0))
            self.inclusive[path] = max(0.0, self.inclusive[path] - cost * self.nested.get(path, 0))
        return cost * self.calls

    def remove(self) -> None:
        for restore in reversed(self.handles):
            restore()
        self.handles = []


def _is_op(ev) -> bool:
    return ev.name.startswith("aten::") or ev.name.startswith("_c10d") or ev.name.startswith("prim::")


def _is_kernel(ev) -> bool:
    return ev.device_type != torch.autograd.DeviceType.CPU


def profile_step(session, step, *, structure: ModelStructure | None = None, label: str = "eager",
                 steps: int = 3, measured_ms: float | None = None, log=None) -> StepProfile:
    """Profile ``step`` (eager when ``structure`` is given: module ranges; else a compiled step).

    Pass 1: rounds over the same ``2 x steps`` positions (:data:`MIN_ROUNDS`..:data:`MAX_ROUNDS`),
    each after one untimed step; rounds timed per module (hooks and a wall clock) alternate, when
    ``measured_ms`` is None, with rounds without hooks (what the profile is compared with, under
    the same load). Hooks stay for a whole round: adding or removing them slows the next step.
    Pairs of rounds alternate between calibration (the wrappers' cost per marked call in this
    model, :func:`~superkernel.tools.advisor.profile_rounds.in_model_cost`) and the profile
    (the middle half of its pairs; each round's fastest quarter of steps), less that cost per
    call (:func:`hook_cost`, on an empty module, when there are no rounds without hooks).
    Pass 2: ``steps`` steps under ``torch.profiler`` (operators, launches).
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    from superkernel.tools.decode import synchronize

    model = session.model
    roles = module_roles(structure) if structure is not None else []
    interleave = measured_ms is None
    steps = max(1, min(steps, (session.total_steps - 1) // (2 if interleave else 1)))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    positions = min(2 * steps, session.total_steps - 1)
    clock = step_clock(session.device, eager=interleave)
    rounds: list[Round] = []
    with torch.no_grad(), session.dynamo_config():
        session.restore_cache()
        step(*session.inputs(0))  # compile / warm caches, not profiled
        spent = 0.0
        gc_was_enabled = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a timed step is charged to whichever module ran
        try:  # pass 1: wall clock per step and per module; rounds with hooks alternate with rounds without
            marks = None
            least, most, enough = (MIN_ROUNDS, MAX_ROUNDS, MIN_TIMED_S) if interleave else \
                (MIN_ROUNDS_COMPILED, MAX_ROUNDS_COMPILED, MIN_TIMED_S_COMPILED)
            for round_ in range(most):
                if enough_rounds(round_, spent, rounds, least=least, enough=enough, interleaved=interleave,
                                 check_settled=bool(roles)):
                    break
                hooked = not interleave or round_ % 2 == 0
                # pairs of rounds (wrapped, bare) alternate between calibration and profile
                rnd = Round(hooked=hooked, calibration=interleave and (round_ // 2) % 2 == 0)
                rounds.append(rnd)
                marks = _Marks(model, roles, profiler=False, clock=clock) if hooked else None
                session.restore_cache()  # the same positions every round
                step(*session.inputs(0))  # untimed: the first step after hooks come or go is slower
                if marks is not None:
                    marks.reset()
                for i in range(1, positions + 1):
                    synchronize(session.device)
                    start = clock()
                    step(*session.inputs(i))
                    synchronize(session.device)
                    took = clock() - start
                    spent += took
                    rnd.times.append(took)
                    if marks is not None:
                        rnd.marks.append(marks.take())
                if marks is not None:
                    marks.remove()
                    marks = None
        finally:
            if marks is not None:
                marks.remove()
            if gc_was_enabled:
                gc.enable()
        if interleave:  # the wrappers' cost measured in this model; the middle half of the profile pairs
            per_call = in_model_cost(rounds) if roles else 0.0
            chosen = profile_pairs(rounds, per_call)
            wrapped = [h for h, _ in chosen]
            measured_ms = sum(b.level for _, b in chosen) / len(chosen) * 1e3
        else:           # no rounds without wrappers to compare with: the cost on an empty module
            per_call = hook_cost(clock=clock) if roles else 0.0
            wrapped = rounds
        timing = _Marks(model, [], profiler=False)
        kept_s, kept_n = 0.0, 0
        for rnd in wrapped:
            for k in rnd.kept:
                timing.add(rnd.marks[k])
                kept_s += rnd.times[k]
                kept_n += 1
        calls = timing.calls / kept_n
        hooks_s = timing.discount(per_call) if roles else 0.0
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
    step_ms = (kept_s - hooks_s) / kept_n * 1e3
    prof_view = _attribute(prof.events(), roles, weight_bytes(model, roles) if roles else {}, label, steps,
                           measured_ms, sum(p.numel() * p.element_size() for p in model.parameters()),
                           session.device.type)
    prof_view.wrapper_us, prof_view.marked_calls = per_call * 1e6, calls
    if session.device.type != "cuda":  # wall-clock times from pass 1 (on CUDA: the profiler's, see docs)
        _use_wall_times(prof_view, timing, roles, step_ms, kept_n)
    return prof_view


def step_clock(device: torch.device, *, eager: bool):
    """The clock of pass 1: this thread's CPU time for an eager step on one CPU thread, else wall time.

    On one thread the whole step runs on the calling thread, so its CPU time is the step's
    time without the time slices other processes took (the machine may be shared); with
    more threads, or on an accelerator, only the wall clock sees all of the work.
    """
    if eager and device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def hook_cost(calls: int = 200, repeats: int = 7, clock=time.perf_counter) -> float:
    """Seconds the timing hooks add to one module call, measured on an empty module.

    Alternating bare and hooked loops, the fastest of each: what the profile subtracts per
    marked call, so the profiled step compares with the step timed without hooks.
    """
    module, x = torch.nn.Identity(), torch.zeros(1)
    role = [ModuleRole("", "other", None)]

    def loop() -> float:
        start = clock()
        for _ in range(calls):
            module(x)
        return clock() - start

    bare, hooked = [], []
    for _ in range(repeats):
        bare.append(loop())
        marks = _Marks(module, role, profiler=False, clock=clock)
        try:
            hooked.append(loop())
        finally:
            marks.remove()
    return max(0.0, (min(hooked) - min(bare)) / calls)


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
