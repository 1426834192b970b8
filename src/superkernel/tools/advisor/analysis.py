"""``superkernel analyze``: model structure plus a trial capture of every candidate scope plan.

Step one of the adaptation workflow (docs/workflow.md): which parts the model has
(attention, MoE with router/experts/shared experts, dense MLP, norms), whether
prefill and decode are separate and the KV cache is preallocated, and -- from a
trial capture per strategy -- graph breaks and the operators each candidate scope
would be cut at, with reasons.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from superkernel.tools.decode import DecodeSession, run_decode
from superkernel.tools.advisor.compiling import compile_superkernel
from superkernel.tools.advisor.strategies import ScopePlan, applicable, auto_plans
from superkernel.tools.advisor.structure import ModelStructure, analyze_structure
from superkernel.util import exception_summary


@dataclass
class TrialCapture:
    """One strategy's scopes captured once with the exactness-reference backend."""

    plan: ScopePlan
    wrapped: list[str] = field(default_factory=list)
    graphs: int = 0
    graph_breaks: int = 0
    segments: list[Any] = field(default_factory=list)   # superkernel.ir.graph SegmentInfo
    cuts: list[Any] = field(default_factory=list)       # superkernel.ir.graph Cut
    unscoped_ops: int = 0
    total_ops: int = 0
    seconds: float = 0.0
    error: str | None = None
    #: the whole decode through the captured step (``trial_capture(..., reference=True)``): the strategy's
    #: exactness reference, so ``optimize`` does not capture the same scopes a second time for it
    reference_logits: torch.Tensor | None = None
    #: the strategy whose captured graph this trial was read from (:func:`labelled_trial`); None: captured itself
    labelled_from: str | None = None
    #: (captured ATen graph, its realization row) while the analysis runs; dropped after it
    captured: Any = field(default=None, repr=False, compare=False)

    @property
    def uncaptured(self) -> list[str]:
        """Scope labels that reached no captured graph (e.g. a graph break inside the scope dropped them)."""
        return missing_labels(self.plan.labels, self.segments) if not self.error else []


def missing_labels(labels: list[str], segments: list[Any]) -> list[str]:
    found = {s.scope for s in segments}
    return [label for label in labels if label not in found]


@dataclass
class BreakInfo:
    reason: str
    where: str | None


@dataclass
class Analysis:
    model_name: str
    architecture: str
    num_parameters: int
    structure: ModelStructure
    not_applicable: dict[str, str]                      # strategy -> reason
    decode_graphs: int = 0
    breaks: list[BreakInfo] = field(default_factory=list)
    kv_cache: str = ""
    prefill_decode: str = ""
    suggested_order: list[str] = field(default_factory=list)
    suggestion_why: str = ""
    trials: list[TrialCapture] = field(default_factory=list)
    #: guards that would make Dynamo recompile the plain decode step at every position, with
    #: what the harness does about each (measured: the step compiled for 3 steps, backend "eager")
    recompile_guards: list[str] = field(default_factory=list)
    recompiles_with_harness: int = 0
    recompile_reasons_with_harness: list[str] = field(default_factory=list)

    @property
    def issues(self) -> list[str]:
        """The potential-problem list of workflow step one: breaks, cuts, scopes lost, captures that failed."""
        out = []
        for guard in self.recompile_guards:
            out.append(f"recompile guard: {guard}")
        if self.recompiles_with_harness:
            out.append(f"the decode step still recompiles {self.recompiles_with_harness} time(s) with the harness's "
                       f"fixes: {'; '.join(self.recompile_reasons_with_harness[:2])}")
        if self.breaks:
            where = sorted({b.where for b in self.breaks if b.where})
            out.append(f"{len(self.breaks)} graph break(s) in the decode step"
                       + (f" at {', '.join(where[:3])}" if where else "") + ": Python control flow or "
                       "data-dependent shapes split the capture")
        if not self.structure.layers:
            out.append("no decoder layer stack found in the module tree: only custom scopes apply")
        for t in self.trials:
            if t.error:
                out.append(f"{t.plan.strategy}: the trial capture failed ({t.error})")
            if t.cuts:
                reasons = sorted({c.reason.split(":")[0] for c in t.cuts})
                out.append(f"{t.plan.strategy}: {len(t.cuts)} cut(s) ({'; '.join(reasons)})")
            if t.uncaptured:
                out.append(f"{t.plan.strategy}: scope(s) {', '.join(t.uncaptured)} reached no captured graph")
        return out

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "model": self.model_name, "architecture": self.architecture, "num_parameters": self.num_parameters,
            "structure": asdict(self.structure), "not_applicable": self.not_applicable,
            "decode_graphs": self.decode_graphs, "graph_breaks": [asdict(b) for b in self.breaks],
            "kv_cache": self.kv_cache, "prefill_decode": self.prefill_decode,
            "suggested_order": self.suggested_order, "issues": self.issues,
            "recompile_guards": self.recompile_guards, "recompiles_with_harness": self.recompiles_with_harness,
            "trials": [{"strategy": t.plan.strategy, "scopes": t.plan.scopes, "wrapped": t.wrapped,
                        "graphs": t.graphs, "graph_breaks": t.graph_breaks,
                        "segments": [asdict(s) for s in t.segments], "cuts": [asdict(c) for c in t.cuts],
                        "unscoped_ops": t.unscoped_ops, "ops": t.total_ops, "seconds": t.seconds,
                        "uncaptured_scopes": t.uncaptured, "error": t.error, "labelled_from": t.labelled_from}
                       for t in self.trials],
        }


def _cache_tensors(layer) -> list[torch.Tensor]:
    out = []
    for value in vars(layer).values():
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, dict):
            out += [v for v in value.values() if isinstance(v, torch.Tensor)]
    return out


def kv_cache_description(session: DecodeSession) -> str:
    layers = list(getattr(session.cache, "layers", []))
    if not layers:
        return "no cache layers (the model keeps no decode state)"
    nbytes = sum(t.numel() * t.element_size() for layer in layers for t in _cache_tensors(layer))
    kinds = Counter(type(layer).__name__ for layer in layers)
    first = next((layer for layer in layers if isinstance(getattr(layer, "keys", None), torch.Tensor)), None)
    k = f" x keys {tuple(first.keys.shape)}" if first is not None else ""
    declared = getattr(session.model, "_can_compile_fullgraph", None)
    claim = {True: "; the model class declares full-graph compile support",
             False: "; the model class does not declare full-graph compile support"}.get(declared, "")
    kind_text = ", ".join(f"{n} {name}" for name, n in kinds.items())
    return (f"preallocated: transformers StaticCache, {len(layers)} layers ({kind_text}){k}, "
            f"max_cache_len {session.max_cache_len}, {nbytes / 2**20:.2f} MiB; written in place{claim}")


PREFILL_DECODE = ("separated by the harness: the model has one forward for both (Hugging Face), so prefill runs "
                  "once uncompiled and unscoped with the whole prompt (dynamic length) and only the decode step "
                  "(1 token, static shapes) is compiled with scopes")


def suggest(structure: ModelStructure) -> tuple[list[str], str]:
    """The adaptation guide's decision tree: MoE models start with MoE, dense ones with attention, then grow."""
    reasons = applicable(structure)
    ok = [s for s, why in reasons.items() if why is None]
    if structure.is_moe:
        first = ["moe", "attention"]
        why = "MoE model: start with the MoE blocks, then attention, then whole decoder layers"
    else:
        first = ["attention", "mlp"]
        why = "dense transformer: start with attention (lowest risk), then MLP, then whole decoder layers"
    order = [s for s in first if s in ok] + [s for s in ok if s not in first]
    return order, why


def _break_infos(break_reasons: list[Any]) -> list[BreakInfo]:
    breaks = []
    for b in break_reasons:
        frame = b.user_stack[-1] if getattr(b, "user_stack", None) else None
        where = f"{frame.filename}:{frame.lineno}" if frame is not None else None
        breaks.append(BreakInfo(reason=" ".join(str(b.reason).split())[:300], where=where))
    return breaks


def dynamo_breaks(session: DecodeSession) -> tuple[int, list[BreakInfo]]:
    """Graphs and graph-break reasons of the unscoped decode step (torch._dynamo.explain)."""
    torch._dynamo.reset()
    ids, pos = session.inputs(0)
    with torch.no_grad(), session.dynamo_config():
        out = torch._dynamo.explain(session.step_fn())(ids, pos)
    session.restore_cache()
    return out.graph_count, _break_infos(out.break_reasons)


@dataclass
class StepFacts:
    """What Dynamo says of the unscoped decode step: its graphs and breaks, and its recompiles."""

    graphs: int
    breaks: list[BreakInfo]
    guards: list[str]                # guard failures as a user would compile it, with the harness's fix
    recompiles_with_harness: int
    reasons_with_harness: list[str]


def step_facts(session: DecodeSession, steps: int = 3) -> StepFacts:
    """:func:`dynamo_breaks` and :func:`recompile_guards` from one set of traces: the first step of the
    harness run is the step ``explain`` traces (same inputs, same Dynamo settings), so its graphs and
    breaks are read there instead of tracing the step once more (one Dynamo trace of the whole step
    less per analysis). Where the harness run cannot be measured, ``explain`` runs on its own as before."""
    guards, recompiles, reasons, first_step = _recompile_guards(session, steps)
    graphs, breaks = first_step if first_step is not None else dynamo_breaks(session)
    return StepFacts(graphs, breaks, guards, recompiles, reasons)


def recompile_guards(session: DecodeSession, steps: int = 3) -> tuple[list[str], int, list[str]]:
    """Which guards would recompile the decode step, measured with Dynamo's "eager" backend.

    Runs the unscoped step twice: for two positions as a user would compile it (no harness settings)
    to list the guard failures, and for ``steps`` positions under the harness's Dynamo settings
    (growing cache ints dynamic, scalar capture) to check it then compiles once.
    """
    return _recompile_guards(session, steps)[:3]


def _recompile_guards(session: DecodeSession, steps: int
                      ) -> tuple[list[str], int, list[str], tuple[int, list[BreakInfo]] | None]:
    """:func:`recompile_guards`, and the graph count and breaks of the harness run's first step (None when
    the runs could not be measured)."""
    from torch._dynamo.backends.debugging import ExplainWithBackend
    from torch._dynamo.utils import guard_failures

    first_step: list[tuple[int, list[BreakInfo]]] = []

    def run(with_harness: bool, steps: int) -> list[str]:
        import contextlib

        torch._dynamo.reset()
        guard_failures.clear()
        explain = ExplainWithBackend("eager") if with_harness else None
        step = torch.compile(session.step_fn(), backend=explain or "eager",
                             dynamic=session.compile_dynamic if with_harness else False)
        session.restore_cache()
        ctx = session.dynamo_config() if with_harness else contextlib.nullcontext()
        try:
            with torch.no_grad(), ctx:
                for i in range(steps):
                    ids = session.tokens[min(i, len(session.tokens) - 1)].reshape(session.batch, 1)
                    step(ids, torch.tensor([session.prompt_len + i], device=session.device))
                    if explain is not None and i == 0:
                        out = explain.output()
                        first_step.append((out.graph_count, _break_infos(out.break_reasons)))
        finally:
            session.restore_cache()
        reasons = [" ".join(r.strip().splitlines()[0].split())[:300] for rs in guard_failures.values() for r in rs]
        torch._dynamo.reset()
        return list(dict.fromkeys(reasons))

    if session.max_cache_len < session.prompt_len + steps:
        steps = max(1, session.max_cache_len - session.prompt_len)
    try:
        # As a user would compile it, two positions show the guard that fails on the next one (a third
        # only repeats it with the next value: another trace of the whole step, another line in the report).
        plain = run(False, min(steps, 2))
        fixed = run(True, steps)
    except Exception as exc:  # reported, never fatal for the analysis
        return [f"could not be measured: {exception_summary(exc, 240, first_line=False)}"], 0, [], None
    guards = []
    for reason in plain[:3]:
        handled = [name for name in session.growing_ints if name in reason]
        fix = (f" — the harness makes `{handled[0]}` a dynamic source (torch.compiler.config.dynamic_sources), so "
               "decode compiles once" if handled else "")
        guards.append(f"`{reason}`{fix}")
    return guards, len(fixed), fixed, first_step[0]


def trial_capture(session: DecodeSession, plan: ScopePlan, *, reference: bool = False,
                  keep_graph: bool = False) -> TrialCapture:
    """Apply the plan's scopes, capture one decode step with run_eagerly, read the explanation.

    ``reference``: also run the session's whole decode through that step and keep its logits
    (``trial.reference_logits``): the capture is the one ``optimize`` compares reduce-overhead plans
    against (:func:`~superkernel.tools.advisor.measure.run_plan`), with the same scopes and no options.
    """
    import superkernel

    trial = TrialCapture(plan=plan)
    model = session.model
    start = time.perf_counter()
    try:
        trial.wrapped = superkernel.apply_scopes(model, plan.scopes)
        step, backend = compile_superkernel(session, "reduce-overhead", run_eagerly=True)
        ids, pos = session.inputs(0)
        with torch.no_grad(), session.dynamo_config():
            step(ids, pos)
        ex = superkernel.explain(backend)
        trial.graphs = len(ex.graphs)
        trial.graph_breaks = ex.graph_breaks
        trial.segments = list(ex.segments)
        trial.cuts = list(ex.cuts)
        trial.unscoped_ops = sum(g.unscoped_ops for g in ex.graphs)
        trial.total_ops = sum(g.num_ops for g in ex.graphs)
        if reference:
            trial.reference_logits = run_decode(session, step, label=f"{plan.strategy} / exactness reference").logits
        if keep_graph and len(backend.reference_graphs) == 1 and not ex.graph_breaks and not backend.scope_breaks:
            trial.captured = backend.reference_graphs[0]
    except Exception as exc:  # a plan that cannot be captured is reported, not fatal for analysis
        trial.error = f"{exception_summary(exc, 340, first_line=False)}"
    finally:
        superkernel.remove_scopes(model)
        session.restore_cache()
        torch._dynamo.reset()
    trial.seconds = time.perf_counter() - start
    return trial


def analyze(model_name: str, session: DecodeSession, plans: list[ScopePlan] | None = None,
            on_trial: Callable[[str], None] | None = None, *, references: bool = False) -> Analysis:
    """Structure, prefill/decode and KV-cache facts, graph breaks, and one trial capture per plan.

    ``plans`` defaults to every strategy that applies (bottom-up). ``references``: each trial also
    decodes the whole session and keeps its logits (see :func:`trial_capture`). The model is traced once: the
    other plans are read from the first capture's graph (:func:`labelled_trial`) where that gives what their
    own capture would.
    """
    model = session.model
    structure = analyze_structure(model)
    reasons = applicable(structure)
    order, why = suggest(structure)
    result = Analysis(model_name=model_name, architecture=structure.architecture,
                      num_parameters=sum(p.numel() for p in model.parameters()), structure=structure,
                      not_applicable={s: r for s, r in reasons.items() if r}, kv_cache=kv_cache_description(session),
                      prefill_decode=PREFILL_DECODE, suggested_order=order, suggestion_why=why)
    facts = step_facts(session)
    result.decode_graphs, result.breaks = facts.graphs, facts.breaks
    result.recompile_guards, result.recompiles_with_harness, result.recompile_reasons_with_harness = \
        facts.guards, facts.recompiles_with_harness, facts.reasons_with_harness
    first: TrialCapture | None = None
    for plan in plans if plans is not None else auto_plans(structure):
        if on_trial is not None:
            on_trial(plan.strategy)
        trial = labelled_trial(first, session, plan) if first is not None else None
        if trial is None:
            trial = trial_capture(session, plan, reference=references, keep_graph=first is None)
            first = first or (trial if trial.captured is not None else None)
        result.trials.append(trial)
    for trial in result.trials:
        trial.captured = None
    return result


def labelled_trial(first: TrialCapture, session: DecodeSession, plan: ScopePlan) -> TrialCapture | None:
    """``plan``'s trial capture read from ``first``'s captured graph with ``plan``'s labels
    (:mod:`superkernel.pipeline.relabel`): the same graph, breaks and exactness reference, its own segments and
    cuts. None when the graph cannot say (labels written in the model's code, more than one graph)."""
    from superkernel.ir.graph import SegmentInfo
    from superkernel.pipeline.relabel import labelled, labels_for, scoped_modules
    from superkernel.pipeline.segments import build_segments

    if first.captured is None or first.error:
        return None
    start = time.perf_counter()
    gm, row = first.captured
    labels = labels_for(gm, session.model, first.plan.scopes, plan.scopes)
    if labels is None:
        return None
    with labelled(gm, labels):
        segmentation = build_segments(gm, cut_rule=row.cut_reason, split_unscoped=False)
    trial = TrialCapture(plan=plan, wrapped=[name for _, name, _ in scoped_modules(session.model, plan.scopes)],
                         graphs=first.graphs, graph_breaks=first.graph_breaks,
                         segments=[SegmentInfo.of(p, "reference") for p in segmentation.segments],
                         cuts=list(segmentation.cuts), total_ops=first.total_ops,
                         unscoped_ops=sum(p.num_ops for p in segmentation.partitions if p.kind == "unscoped"),
                         reference_logits=first.reference_logits, labelled_from=first.plan.strategy)
    trial.seconds = time.perf_counter() - start
    return trial
