"""Result records of the workflow: one per baseline or plan (strategy x mode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from superkernel.tools.advisor.precision import Diff, Verdict

PASSED, FAILED, ERROR, BASELINE = "passed", "failed", "error", "baseline"


@dataclass
class RunResult:
    name: str                                  # "eager", "torch.compile", "attention / reduce-overhead"
    kind: str                                  # "baseline" or "plan"
    strategy: str | None = None
    mode: str | None = None
    scopes: dict[str, list[str]] = field(default_factory=dict)
    wrapped: list[str] = field(default_factory=list)
    segments: int = 0
    cuts: list[Any] = field(default_factory=list)        # superkernel Cut records
    fallbacks: list[str] = field(default_factory=list)   # "segment: cause"
    graph_breaks: int = 0
    uncaptured: list[str] = field(default_factory=list)  # scope labels that reached no captured graph
    realizations: dict[str, int] = field(default_factory=dict)
    median_ms: float | None = None
    p90_ms: float | None = None
    tokens_per_s: float | None = None
    compile_s: float | None = None
    vs_reference: Diff | None = None
    vs_eager: Diff | None = None
    verdict: Verdict | None = None
    error: str | None = None
    logits: torch.Tensor | None = field(default=None, repr=False)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    dynamo: Any = None                                    # decode.DynamoCounts of the measured run

    @property
    def recompiles_timed(self) -> int | None:
        return self.dynamo.recompiles_timed if self.dynamo is not None else None

    @property
    def recompiles(self) -> bool:
        """Dynamo recompiled during the timed steps (or gave up after its recompile limit)."""
        return self.dynamo is not None and self.dynamo.recompiles_in_steady_state

    @property
    def recompile_reason(self) -> str:
        if self.dynamo is None or not self.recompiles:
            return ""
        reason = self.dynamo.reasons[0] if self.dynamo.reasons else "no guard failure recorded"
        return (f"Dynamo recompiled {self.dynamo.recompiles_timed} time(s) during the timed steps"
                + (" and hit its recompile limit (the step then runs uncompiled)" if self.dynamo.limit_hit else "")
                + f"; guard that failed: {reason}")

    @property
    def status(self) -> str:
        if self.kind == "baseline":
            return ERROR if self.error else BASELINE
        if self.error:
            return ERROR
        return PASSED if self.verdict is not None and self.verdict.passed else FAILED

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "strategy": self.strategy, "mode": self.mode,
            "status": self.status, "scopes": self.scopes, "wrapped_modules": self.wrapped,
            "segments": self.segments, "realizations": self.realizations,
            "cuts": [{"scope": c.scope, "op": c.op, "node": c.node_index, "reason": c.reason, "source": c.source}
                     for c in self.cuts],
            "fallbacks": self.fallbacks, "graph_breaks": self.graph_breaks, "uncaptured_scopes": self.uncaptured,
            "decode_ms_median": self.median_ms, "decode_ms_p90": self.p90_ms, "tokens_per_s": self.tokens_per_s,
            "compile_s": self.compile_s, "speedup_vs_eager": self.speedup_vs_eager,
            "speedup_vs_torch_compile": self.speedup_vs_compile,
            "vs_reference": self.vs_reference.to_dict() if self.vs_reference else None,
            "vs_eager": self.vs_eager.to_dict() if self.vs_eager else None,
            "precision_rule": self.verdict.rule if self.verdict else None,
            "precision_verdict": self.verdict.reason if self.verdict else None,
            "error": self.error,
            "dynamo": self.dynamo.to_dict() if self.dynamo is not None else None,
            "recompiles_timed": self.recompiles_timed,
            "recompiles_in_steady_state": self.recompiles,
        }


def fill_speedups(results: list[RunResult], eager: RunResult | None, compiled: RunResult | None) -> None:
    for r in results:
        if r.median_ms:
            if eager is not None and eager.median_ms:
                r.speedup_vs_eager = eager.median_ms / r.median_ms
            if compiled is not None and compiled.median_ms:
                r.speedup_vs_compile = compiled.median_ms / r.median_ms


def recommendable(r: RunResult) -> bool:
    """A plan that passed precision, was timed, and compiled once (no recompiles in the timed steps)."""
    return r.kind == "plan" and r.passed and r.median_ms is not None and not r.recompiles


def recommend(results: list[RunResult]) -> RunResult | None:
    """The fastest plan (median decode step) among those that passed precision and did not recompile."""
    passing = [r for r in results if recommendable(r)]
    return min(passing, key=lambda r: r.median_ms) if passing else None


#: A plan must beat plain torch.compile by more than this (relative) to be recommended
#: over it; smaller differences are within the run-to-run noise of a decode step.
NOISE_FLOOR = 0.03


@dataclass
class Recommendation:
    """What ``optimize`` recommends: a superkernel plan, plain torch.compile, or nothing."""

    kind: str                         # "plan", "torch.compile" or "none"
    plan: RunResult | None = None     # the plan (kind "plan"); the best passing plan otherwise, if any
    baseline: RunResult | None = None  # the torch.compile baseline (kind "torch.compile")
    reason: str = ""
    noise: float = NOISE_FLOOR

    @property
    def name(self) -> str | None:
        if self.kind == "plan" and self.plan is not None:
            return self.plan.name
        return "torch.compile" if self.kind == "torch.compile" else None


def noise_threshold(drift: float | None = None) -> float:
    return max(NOISE_FLOOR, abs(drift or 0.0))


def decide(results: list[RunResult], drift: float | None = None) -> Recommendation:
    """Honest recommendation: a superkernel plan only when it beats plain torch.compile beyond noise.

    - the best plan = the fastest that passed precision and compiled once (:func:`recommend`);
    - it is recommended when it is faster than torch.compile by more than the noise
      (``max(NOISE_FLOOR, |eager drift|)``) and not slower than eager;
    - otherwise plain torch.compile is recommended when it ran without recompiles and is not
      slower than eager; failing that, nothing is.
    """
    noise = noise_threshold(drift)
    best = recommend(results)
    eager = next((r for r in results if r.name == "eager" and r.median_ms), None)
    inductor = next((r for r in results if r.name == "torch.compile" and not r.error and r.median_ms), None)
    inductor_ok = inductor is not None and not inductor.recompiles
    if best is not None:
        slower_than_eager = eager is not None and best.median_ms > eager.median_ms * (1 + noise)
        if inductor_ok:
            gain = inductor.median_ms / best.median_ms - 1
            if gain > noise and not slower_than_eager:
                return Recommendation("plan", best, inductor, reason=(
                    f"{best.name} beats plain torch.compile by {gain:.1%} (noise threshold {noise:.1%})"), noise=noise)
        elif not slower_than_eager:
            why = (f"plain torch.compile {'recompiled' if inductor is not None else 'could not run'}"
                   f"{': ' + inductor.recompile_reason if inductor is not None and inductor.recompiles else ''}")
            return Recommendation("plan", best, inductor, reason=f"{best.name} passed; {why}", noise=noise)
    if inductor_ok and not (eager is not None and inductor.median_ms > eager.median_ms * (1 + noise)):
        if best is None:
            why = "no superkernel plan passed precision and compiled once"
        else:
            ratio = inductor.median_ms / best.median_ms
            why = (f"the best superkernel plan ({best.name}) runs at {ratio:.2f}x plain torch.compile; a plan must "
                   f"be faster by more than the noise threshold ({noise:.1%})" if ratio - 1 <= noise else
                   f"the best superkernel plan ({best.name}) is slower than eager")
        return Recommendation("torch.compile", best, inductor, reason=why, noise=noise)
    parts = []
    if best is None:
        parts.append("no superkernel plan passed precision and compiled once")
    else:
        parts.append(f"the best plan ({best.name}) is slower than eager")
    if inductor is None:
        parts.append("plain torch.compile could not run")
    elif inductor.recompiles:
        parts.append(f"plain torch.compile recompiles ({inductor.recompile_reason})")
    else:
        parts.append("plain torch.compile is slower than eager")
    return Recommendation("none", best, inductor, reason="; ".join(parts), noise=noise)
