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
    inductor: dict[str, Any] = field(default_factory=dict)  # CompilerConfig.inductor choices the run made
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
    profile: Any = None                                   # profile.StepProfile of the compiled step
    profile_error: str | None = None
    guard_path: str | None = None                         # what a call checks: full-guards / precompiled
    guard_cost_us: dict[str, float] = field(default_factory=dict)  # measured cost of one check
    step: Any = field(default=None, repr=False)           # the compiled step, kept while the search runs
    own_median_ms: float | None = None                    # auto: the run's own median, before the re-timing
    timing: str = "own"                                   # "own" (its run) or "interleaved" (see search.py)
    rounding_floor: Any = None                            # eager, W8A8: rounding_floor.RoundingFloor

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
            "profile": self.profile.to_dict() if self.profile is not None else None,
            "profile_error": self.profile_error,
            "guard_path": self.guard_path, "guard_cost_us": self.guard_cost_us,
            "timing": self.timing, "decode_ms_median_own_run": self.own_median_ms,
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
#: An eager drift beyond this: the machine's speed changed so much during the run that no
#: comparison between plans measured at different times means anything (a busy machine).
UNSTEADY_DRIFT = 0.25


@dataclass
class Recommendation:
    """What ``optimize`` recommends: a superkernel plan, plain torch.compile, or nothing."""

    kind: str                         # "plan", "torch.compile", "eager" (keep it) or "none" (nothing passed)
    plan: RunResult | None = None     # the plan (kind "plan"); the best passing plan otherwise, if any
    baseline: RunResult | None = None  # the torch.compile baseline (kind "torch.compile")
    reason: str = ""
    noise: float = NOISE_FLOOR

    @property
    def unsteady(self) -> bool:
        """The run's eager drift exceeded :data:`UNSTEADY_DRIFT`: its comparisons are not reliable."""
        return self.noise > UNSTEADY_DRIFT

    @property
    def name(self) -> str | None:
        if self.kind == "plan" and self.plan is not None:
            return self.plan.name
        if self.kind == "torch.compile" and self.baseline is not None:
            return self.baseline.name  # "torch.compile" or "torch.compile reduce-overhead"
        return {"torch.compile": "torch.compile", "eager": "eager"}.get(self.kind)

    @property
    def torch_compile_mode(self) -> str | None:
        """The mode a ``backend: torch.compile`` plan records (None: plain torch.compile)."""
        chosen = self.baseline if self.kind == "torch.compile" else None
        return "reduce-overhead" if chosen is not None and chosen.name == REDUCE_OVERHEAD_BASELINE else None


#: the CUDA-only baseline: torch.compile with Inductor's kernels in one CUDA graph
REDUCE_OVERHEAD_BASELINE = "torch.compile reduce-overhead"


def faster_reduce_overhead_baseline(results: list[RunResult], best: RunResult | None,
                                    noise: float = NOISE_FLOOR) -> RunResult | None:
    """The ``torch.compile(mode="reduce-overhead")`` baseline (measured on CUDA) when it ran right and beat
    ``best`` by more than ``noise``: the recommendation compares with plain torch.compile, and a GPU user
    must still hear that this peer was faster (seen on an H200: llama-tiny, 0.368 ms against the
    recommended plan's 0.403 ms)."""
    ro = next((r for r in results if r.name == REDUCE_OVERHEAD_BASELINE and not r.error and r.median_ms), None)
    if ro is None or best is None or not best.median_ms:
        return None
    return ro if best.median_ms > ro.median_ms * (1 + noise) else None


def noise_threshold(drift: float | None = None) -> float:
    return max(NOISE_FLOOR, abs(drift or 0.0))


def not_slower_than_eager(r: RunResult, results: list[RunResult]) -> bool:
    """``r`` is not slower than the run's eager step by more than NOISE_FLOOR (strict: the drift never excuses a
    slowdown); true when eager was not timed."""
    eager = next((e for e in results if e.name == "eager" and e.median_ms), None)
    return eager is None or r.median_ms <= eager.median_ms * (1 + NOISE_FLOOR)


def decide(results: list[RunResult], drift: float | None = None) -> Recommendation:
    """:func:`decide_against_plain`, then the CUDA peer ``torch.compile(mode="reduce-overhead")`` when it ran right,
    in steady state, not slower than eager, and beat the chosen plan (or plain torch.compile) beyond noise: a GPU
    user gets the fastest correct thing measured (an H200 run: llama-tiny 0.368 ms against the plan's 0.403 ms)."""
    rec = decide_against_plain(results, drift)
    if rec.kind not in ("plan", "torch.compile"):
        return rec
    chosen = rec.plan if rec.kind == "plan" else rec.baseline
    ro = faster_reduce_overhead_baseline(results, chosen, rec.noise)
    if ro is None or ro.recompiles or not not_slower_than_eager(ro, results):
        return rec
    return Recommendation("torch.compile", rec.plan, ro, noise=rec.noise, reason=(
        f"torch.compile(mode=\"reduce-overhead\") ran at {chosen.median_ms / ro.median_ms:.2f}x the speed of "
        f"{chosen.name}, beyond the noise threshold of {rec.noise:.1%}"))


def decide_against_plain(results: list[RunResult], drift: float | None = None) -> Recommendation:
    """Honest recommendation: a superkernel plan only when it beats plain torch.compile beyond noise.

    - no plan passed precision and compiled once: nothing (kind "none"; the report says why);
    - the best plan (the fastest that passed and compiled once, :func:`recommend`) when it is
      faster than torch.compile by more than the noise (``max(NOISE_FLOOR, |eager drift|)``)
      and not slower than eager (by more than NOISE_FLOOR: the drift never excuses a slowdown);
    - else plain torch.compile when it ran without recompiles and is not slower than eager;
    - else the best plan if it is not slower than eager (torch.compile failed or recompiled);
    - else keep eager (kind "eager").
    """
    noise = noise_threshold(drift)
    best = recommend(results)
    inductor = next((r for r in results if r.name == "torch.compile" and not r.error and r.median_ms), None)
    inductor_ok = inductor is not None and not inductor.recompiles

    def not_slower(r: RunResult) -> bool:
        return not_slower_than_eager(r, results)

    if best is None:
        return Recommendation("none", None, inductor, noise=noise,
                              reason="no plan passed precision and compiled once (no recompiles in the timed steps)")
    ratio = inductor.median_ms / best.median_ms if inductor_ok else None
    if ratio is not None and ratio - 1 > noise and not_slower(best):
        return Recommendation("plan", best, inductor, noise=noise, reason=(
            f"{ratio:.2f}x plain torch.compile, beyond the noise threshold of {noise:.1%}"))
    if inductor_ok and not_slower(inductor):
        why = (f"the best superkernel plan ({best.name}) runs at {ratio:.2f}x plain torch.compile; a plan must be "
               f"faster by more than the noise threshold ({noise:.1%})" if not_slower(best) else
               f"the best superkernel plan ({best.name}) is slower than eager")
        return Recommendation("torch.compile", best, inductor, reason=why, noise=noise)
    if not inductor_ok and not_slower(best):
        why = ("plain torch.compile could not run" if inductor is None else
               f"plain torch.compile recompiles in steady state ({inductor.recompile_reason})")
        return Recommendation("plan", best, inductor, noise=noise, reason=f"passed precision; {why}")
    return Recommendation("eager", best, inductor, noise=noise, reason=(
        f"keep eager: the best superkernel plan ({best.name}) and plain torch.compile are both slower than eager "
        f"(by more than {NOISE_FLOOR:.0%}) on this machine"))
