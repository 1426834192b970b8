"""Which plans ``optimize`` measures: all of them (``--exhaustive``) or the best predicted first (auto).

Auto search (docs/workflow.md, "How auto chooses"): plans are tried in order of predicted
gain (:mod:`~superkernel.tools.advisor.predict`), plans that cover too little or whose
trial capture failed are skipped, and the search stops when no remaining plan is predicted
to beat the best measured one by more than the noise threshold. Each mode's first plan is
always measured, since its efficiency is only known once a plan of it ran.
"""

from __future__ import annotations

from typing import Callable

import torch

from superkernel.tools.advisor.predict import Forecast, next_decision, predict_ms
from superkernel.tools.advisor.results import NOISE_FLOOR, RunResult, recommendable
from superkernel.tools.advisor.strategies import ScopePlan

RunPlan = Callable[[ScopePlan, tuple[str, ...]], list[RunResult]]


def _record(forecasts: list[Forecast], results: list[RunResult]) -> None:
    for r in results:
        f = next((f for f in forecasts if f.strategy == r.strategy and f.mode == r.mode), None)
        if f is not None:
            f.status = "measured"
            f.measured_ms = r.median_ms if not r.error else None
            f.passed = recommendable(r)
            if r.error:
                f.reason = f"error: {r.error[:200]}"
            elif not r.passed:
                f.reason = "failed precision"
            elif r.recompiles:
                f.reason = "recompiles in steady state"


def run_search(plans: list[ScopePlan], modes: tuple[str, ...], forecasts: list[Forecast], run_plan: RunPlan, *,
               base_ms: float, prior: float, exhaustive: bool, noise: float = NOISE_FLOOR,
               note: Callable[[str], None] = lambda text: None) -> list[RunResult]:
    """Measure plans through ``run_plan(plan, modes)``; fills each forecast's status, reason and numbers.
    ``base_ms``: the whole step compiled without scopes (:func:`~superkernel.tools.advisor.predict.base_step_ms`)."""
    for f in forecasts:
        f.prior_ms = predict_ms(f, base_ms, prior)
    results: list[RunResult] = []
    if exhaustive:
        for f in forecasts:
            f.predicted_ms = f.prior_ms
        for plan in plans:
            out = run_plan(plan, tuple(modes))
            _record(forecasts, out)
            results += out
        return results
    by_strategy = {p.strategy: p for p in plans}
    while True:
        best = min((r for r in results if recommendable(r)), key=lambda r: r.median_ms, default=None)
        decision = next_decision(forecasts, base_ms, prior, best.median_ms if best else None,
                                 best.name if best else None, noise)
        if decision is None:
            break
        f, run = decision
        if not run:
            f.status = "skipped"
            note(f"skipped {f.name}: {f.reason}")
            continue
        out = run_plan(by_strategy[f.strategy], (f.mode,))
        _record(forecasts, out)
        results += out
    torch._dynamo.reset()
    return results
