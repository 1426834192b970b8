"""Measure baselines and scope plans on one decode session, with precision checks."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch

from superkernel.tools.decode import DecodeRun, DecodeSession, run_decode
from superkernel.tools.advisor.analysis import missing_labels
from superkernel.tools.advisor.compiling import compile_inductor, compile_superkernel, guard_path_of
from superkernel.tools.advisor.plan_file import inductor_choices
from superkernel.tools.advisor.precision import (MAX_AUTOTUNE_TOLERANCE, compare, default_tolerance, judge,
                                                 measures_floor)
from superkernel.tools.advisor.progress import Reporter
from superkernel.tools.advisor.results import REDUCE_OVERHEAD_BASELINE, RunResult
from superkernel.tools.advisor.rounding_floor import RoundingFloor, rounding_floor
from superkernel.tools.peer_check import PeerCheck
from superkernel.tools.advisor.strategies import ScopePlan
from superkernel.util import exception_summary


def _run(session: DecodeSession, step, label: str, reporter: Reporter) -> DecodeRun:
    with reporter.task(f"compiling {label}", total=session.total_steps) as update:
        return run_decode(session, step, label=label,
                          on_step=reporter.decode_callback(update, f"compiling {label}", f"running {label}"))


def _fill_timing(result: RunResult, run: DecodeRun) -> None:
    result.median_ms, result.p90_ms = run.median_ms, run.p90_ms
    result.tokens_per_s, result.compile_s = run.tokens_per_s, run.compile_seconds
    result.logits = run.logits
    result.dynamo = run.dynamo


def run_baselines(session: DecodeSession, reporter: Reporter, *, keep: bool = False) -> list[RunResult]:
    """Eager (uncompiled), plain torch.compile (Inductor) and, on CUDA, torch.compile reduce-overhead.

    ``keep``: the compiled baselines stay valid after the call (``result.step``: the search's showdown times
    plans again interleaved with plain torch.compile); no ``torch._dynamo.reset()``.

    Each compiled baseline's logits are checked against eager's (:mod:`superkernel.tools.peer_check`);
    one that is wrong gets ``error`` set: it stays in the table and is never a baseline. For a W8A8 model eager's
    rounding floor is measured first (``results[0].rounding_floor``; :mod:`.rounding_floor`) and widens that check.
    """
    results = []
    eager = RunResult(name="eager", kind="baseline")
    run = _run(session, session.step_fn(), "eager (uncompiled)", reporter)
    _fill_timing(eager, run)
    eager.compile_s = 0.0
    results.append(eager)
    if measures_floor(session.model):
        eager.rounding_floor = measure_floor(session, eager.logits, reporter)
    variants = [("torch.compile", None)]
    if session.device.type == "cuda":
        variants.append((REDUCE_OVERHEAD_BASELINE, "reduce-overhead"))
    for name, mode in variants:
        res = RunResult(name=name, kind="baseline")
        try:
            step = compile_inductor(session, mode, keep=keep)
            _fill_timing(res, _run(session, step, name, reporter))
            res.step = step if keep else None
        except Exception as exc:  # reported in the table; plans still run
            res.error = exception_summary(exc, 440, first_line=False)
        results.append(res)
    tolerance = default_tolerance(session.model, eager.rounding_floor)
    for r in results:
        if r.logits is not None:
            r.vs_eager = compare(r.logits, eager.logits)
            check = PeerCheck(tolerance)
            if r is not eager and not check.check(r.logits, eager.logits):
                # a wrong peer is shown, never used as a baseline (the workflow skips errored baselines)
                r.error = f"wrong output, not used as a baseline: {check.summary()}"
    if not keep:
        torch._dynamo.reset()
    return results


def measure_floor(session: DecodeSession, eager_logits: torch.Tensor, reporter: Reporter) -> RoundingFloor | None:
    """W8A8's rounding floor, with a progress line and a note of what it found; None (and a note saying why, the
    fixed W8A8 tolerance applies) when eager cannot be run with its embeddings perturbed."""
    try:
        with reporter.task("W8A8 rounding floor (eager, embeddings one ulp off)"):
            floor = rounding_floor(session, eager_logits)
    except Exception as exc:  # extra information: the fixed W8A8 tolerance still judges
        reporter.note(f"W8A8 rounding floor not measured ({exception_summary(exc, 200)}); max-autotune is judged "
                      f"at the fixed W8A8 tolerance unless --tolerance is given")
        return None
    reporter.note(f"W8A8 rounding floor: eager with its {floor.perturbed} output one ulp off moves the logits by "
                  f"{floor.max_abs:.3g} ({floor.relative:.2g} of their scale, top-1 agreement "
                  f"{floor.top1_agreement:.0%}); without --tolerance max-autotune is judged at "
                  f"{default_tolerance(session.model, floor):.2g} x the logit scale")
    return floor


def _explain_into(result: RunResult, backend: Any) -> None:
    import superkernel

    ex = superkernel.explain(backend)
    result.segments = len(ex.segments)
    result.cuts = list(ex.cuts)
    result.graph_breaks = ex.graph_breaks
    result.fallbacks = [f"{s.name}: {s.fallback}" for s in ex.fallbacks]
    result.realizations = dict(Counter(s.realization for s in ex.segments))
    result.inductor = inductor_choices(ex)
    result.uncaptured = missing_labels(list(result.scopes), ex.segments)


def _profile_into(result: RunResult, profile: Callable[[Any, RunResult], Any], step, reporter: Reporter) -> None:
    with reporter.task(f"profiling {result.name}"):
        try:
            result.profile = profile(step, result)
        except Exception as exc:  # the profile is extra information: never fails the plan
            result.profile_error = exception_summary(exc, 240, first_line=False)


def run_plan(session: DecodeSession, plan: ScopePlan, modes: tuple[str, ...], eager_logits: torch.Tensor, *,
             options: str = "", tolerance: float = MAX_AUTOTUNE_TOLERANCE, reporter: Reporter,
             references: dict[str, torch.Tensor] | None = None,
             profile: Callable[[Any, RunResult], Any] | None = None, keep: bool = False) -> list[RunResult]:
    """One exactness reference for the plan's scopes, then one measured run per mode.

    The reference logits are stored in ``references[plan.strategy]`` when a dict is given,
    and reused from there when that strategy's reference was already run (the auto search
    measures a strategy's modes at different times). ``profile(step, result)``, when given,
    profiles each measured step while it is still compiled (``result.profile``). ``keep``: the session
    is the plan's own (a copy): its scopes stay applied and each measured step stays valid in
    ``result.step`` (no ``torch._dynamo.reset()``), for the search's interleaved re-timing.
    """
    import superkernel

    model = session.model
    kept = {"keep": True} if keep else {}
    results = [RunResult(name=f"{plan.strategy} / {mode}", kind="plan", strategy=plan.strategy, mode=mode,
                         scopes=plan.scopes) for mode in modes]
    try:
        wrapped = superkernel.apply_scopes(model, plan.scopes, options=options)
        for r in results:
            r.wrapped = wrapped
        try:
            reference = references.get(plan.strategy) if references is not None else None
            if reference is None:
                ref_step, _ = compile_superkernel(session, "reduce-overhead", run_eagerly=True, **kept)
                reference = _run(session, ref_step, f"{plan.strategy} / exactness reference", reporter).logits
            if references is not None:
                references[plan.strategy] = reference
        except Exception as exc:
            for r in results:
                r.error = f"exactness reference could not be captured: {exception_summary(exc, 440, first_line=False)}"
            return results
        for r in results:
            try:
                with reporter.phase(f"building {r.name}"):  # reduce-overhead: built here; others: at their first step
                    step, backend = compile_superkernel(session, r.mode, **kept)
                _fill_timing(r, _run(session, step, r.name, reporter))
                r.compile_s += getattr(step, "build_seconds", 0.0)  # a precompiled step compiles before its 1st call
                _explain_into(r, backend)
                if profile is not None:
                    _profile_into(r, profile, step, reporter)
                r.guard_path, r.guard_cost_us = guard_path_of(step, session)
            except Exception as exc:
                r.error = exception_summary(exc, 440, first_line=False)
                continue
            r.vs_reference = compare(r.logits, reference)
            r.vs_eager = compare(r.logits, eager_logits)
            r.verdict = judge(r.mode, r.vs_reference, reference, tolerance)
            r.step = step if keep else None
    finally:
        if not keep:
            superkernel.remove_scopes(model)
        session.restore_cache()
        if not keep:
            torch._dynamo.reset()
    return results
