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
        }


def fill_speedups(results: list[RunResult], eager: RunResult | None, compiled: RunResult | None) -> None:
    for r in results:
        if r.median_ms:
            if eager is not None and eager.median_ms:
                r.speedup_vs_eager = eager.median_ms / r.median_ms
            if compiled is not None and compiled.median_ms:
                r.speedup_vs_compile = compiled.median_ms / r.median_ms


def recommend(results: list[RunResult]) -> RunResult | None:
    """The fastest plan (median decode step) among those that passed precision."""
    passing = [r for r in results if r.kind == "plan" and r.passed and r.median_ms is not None]
    return min(passing, key=lambda r: r.median_ms) if passing else None
