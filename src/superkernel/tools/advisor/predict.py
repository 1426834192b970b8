"""Predicted gain of each candidate plan from the eager profile and the trial captures.

The model is deliberately simple and stated in the report next to the measured numbers:

- **base**: the step compiled as a whole without scopes. Any plan compiles the whole step,
  and on a small model most of the gain is that (Python, module and dispatch overhead
  removed everywhere, scoped or not): on gemma2 / gpt_neox tiny every plan, however narrow
  its scopes (7% to 66% of the step), ran 3-6x faster than eager, close to plain
  ``torch.compile``. So the base is plain ``torch.compile``'s step measured in this run;
- **covered time**: the share of the eager step inside the modules a plan's scopes wrap (the
  profile's inclusive module times), scaled by the share of the scoped operators that end up
  in segments of more than one operator (a cut operator runs alone: ``analyze``'s trial
  capture says where): the **fused share**;
- **scope efficiency** of a mode: the part of the fused share's time the scopes remove on top
  of the base. Before any plan of the mode is measured it is 0 (the prior: nothing measured
  says what the scopes add, so every plan is predicted at the base and the widest fused
  share goes first); once plans of that mode were measured, the largest efficiency one
  reached (calibrated, optimistic). It may be negative: a mode whose scoped plans ran slower
  than the plain compile predicts narrower scopes to do better; and above 1 where the plain
  compile is a poor base (qwen2_moe: Inductor's step, plain or max-autotune, 14 ms; the
  reduce-overhead plan 1.3 ms). (The prior used to be the
  part of the eager step plain torch.compile removed, applied to the covered share alone:
  predicted 2.2x gemma2's measured attention step, it made auto skip exhaustive's best.)
- predicted step = base x (1 - fused share x efficiency); launches removed = scoped operators
  minus segments (from the trial capture).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Plans whose fused covered time is under this share of the eager step are not tried by auto.
MIN_SHARE = 0.10
#: Fused shares this close (absolute) are the same to the prediction (a tie is then measured, if cheap).
SAME_SHARE = 0.01
#: A mode's compile is cheap (a tie is then measured) at most this x plain torch.compile's compile time
#: (llama-tiny on 2 cores: reduce-overhead 4 s, plain torch.compile 42 s, max-autotune 43-72 s).
CHEAP_COMPILE = 0.5
#: The part of the eager step the plain compile is assumed to remove when it could not be timed.
DEFAULT_EFFICIENCY = 0.5


@dataclass
class Forecast:
    """One candidate plan (strategy x mode): what the profile predicts, what happened."""

    strategy: str
    mode: str
    share: float                       # of the eager step inside the plan's scopes
    fused_fraction: float              # of the scoped operators, those in segments of > 1 operator
    launches_removed: int
    segments: int
    cuts: int
    trial_error: str | None = None
    uncaptured: list[str] | None = None
    prior_ms: float | None = None      # predicted before any plan was measured
    predicted_ms: float | None = None  # predicted when the search decided about it
    status: str = "pending"            # "measured", "skipped" (auto) or "pending"
    reason: str = ""
    measured_ms: float | None = None
    passed: bool | None = None
    compile_s: float | None = None     # the measured plan's compile time
    rounds: int = 0                    # auto: interleaved rounds its measured step is the median of
    remeasured: str = ""               # auto: why it was timed again before it counted
    showdown_ms: float | None = None   # auto: its step in the final showdown
    largest_segment: int = 0           # operators in its largest segment (trial capture)

    @property
    def name(self) -> str:
        return f"{self.strategy} / {self.mode}"

    @property
    def fused_share(self) -> float:
        return self.share * self.fused_fraction

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.name, "strategy": self.strategy, "mode": self.mode, "covered_share": self.share,
                "fused_fraction": self.fused_fraction, "launches_removed": self.launches_removed,
                "segments": self.segments, "cuts": self.cuts, "trial_error": self.trial_error,
                "predicted_ms_prior": self.prior_ms, "predicted_ms": self.predicted_ms, "status": self.status,
                "reason": self.reason, "measured_ms": self.measured_ms, "passed": self.passed,
                "compile_s": self.compile_s, "interleaved_rounds": self.rounds, "remeasured": self.remeasured,
                "showdown_ms": self.showdown_ms}


def covered_paths(model, scopes: dict[str, list[str]]) -> list[str]:
    """The outermost module paths a plan's globs match."""
    from superkernel.scope_apply import match_modules

    paths = sorted({name for globs in scopes.values() for g in globs for name, _ in match_modules(model, g)})
    return [p for p in paths if not any(p != q and p.startswith(q + ".") for q in paths)]


def covered_share(profile, model, scopes: dict[str, list[str]]) -> float:
    """Share of the profiled eager step spent inside the plan's scoped modules."""
    if not profile.step_ms:
        return 0.0
    total = 0.0
    for path in covered_paths(model, scopes):
        if path in profile.module_ms:
            total += profile.module_ms[path]
        else:  # a module the profile did not mark: the marked modules inside it
            total += sum(ms for p, ms in profile.module_ms.items() if p.startswith(path + ".")
                         and not any(q != p and p.startswith(q + ".") and q.startswith(path + ".")
                                     for q in profile.module_ms))
    return min(1.0, total / profile.step_ms)


def forecasts_for(plans, modes, profile, model, trials) -> list[Forecast]:
    """One forecast per plan and mode; ``trials`` are analyze's trial captures, by strategy."""
    out = []
    by_strategy = {t.plan.strategy: t for t in trials}
    for plan in plans:
        trial = by_strategy.get(plan.strategy)
        share = covered_share(profile, model, plan.scopes)
        fused, removed, segments, cuts, error, uncaptured, largest = 1.0, 0, 0, 0, None, [], 0
        if trial is not None:
            error = trial.error
            scoped = sum(s.num_ops for s in trial.segments)
            fused = (sum(s.num_ops for s in trial.segments if s.num_ops > 1) / scoped) if scoped else 0.0
            removed = sum(max(0, s.num_ops - 1) for s in trial.segments)
            segments, cuts, uncaptured = len(trial.segments), len(trial.cuts), trial.uncaptured
            largest = max((s.num_ops for s in trial.segments), default=0)
            if uncaptured and set(uncaptured) == set(plan.labels):
                fused = 0.0
        for mode in modes:
            out.append(Forecast(plan.strategy, mode, share, fused, removed, segments, cuts, error, uncaptured,
                                largest_segment=largest))
    return out


#: Scope efficiency of a mode before any of its plans was measured (see the module doc).
PRIOR_EFFICIENCY = 0.0


def base_step_ms(eager_ms: float, inductor_ms: float | None) -> float:
    """The whole step compiled without scopes: plain torch.compile's step (when it could not be timed,
    eager x (1 - :data:`DEFAULT_EFFICIENCY`))."""
    return inductor_ms if inductor_ms else eager_ms * (1 - DEFAULT_EFFICIENCY)


def efficiency(forecasts: list[Forecast], mode: str, base_ms: float) -> float | None:
    """The largest efficiency a measured, passing plan of ``mode`` reached (None: none measured yet).

    Not bounded: above 1 when a plan ran much faster than the base (qwen2_moe's all_layers /
    reduce-overhead ran 10x faster than plain torch.compile's Inductor step), below 0 when
    the mode's plans ran slower than the base. A plan with the same fused share as the measured one is
    then predicted at its measured step (a bound of 95% predicted qwen2_moe's decoder_layer 3.4x slower
    than the identical-share all_layers it had just measured)."""
    effs = [(base_ms - f.measured_ms) / (base_ms * f.fused_share) for f in forecasts
            if f.mode == mode and f.status == "measured" and f.passed and f.measured_ms and f.fused_share > 0]
    return max(effs) if effs else None


def predict_ms(f: Forecast, base_ms: float, eff: float) -> float:
    """base x (1 - fused share x efficiency), never below 0 (an efficiency above 1 from a narrower plan)."""
    return base_ms * max(0.0, 1 - f.fused_share * eff)


def compile_order(f: Forecast) -> int:
    """Between plans the prediction ties, which compiles sooner: the one with the smaller largest segment.
    Identical segments compile once — Inductor's (:mod:`superkernel.runtime.inductor.shared_kernels`) and the
    native module's one C++ function (:mod:`superkernel.runtime.cpu.native`) — while a scope over the whole stack
    is one program of every layer. SmolLM2-135M, 30 layers, cold caches, 2 cores, 1 thread: max-autotune
    ``decoder_layer`` 167 s vs ``all_layers`` 381 s (steps level, 62 / 62 ms warm); reduce-overhead 84 s vs 98 s
    (steps 88 / 102 ms in those runs; gpt_neox tiny: per-layer segments 1.17x faster)."""
    return f.largest_segment


def next_decision(forecasts: list[Forecast], base_ms: float, prior: float, best_ms: float | None,
                  best_name: str | None, noise: float, cheap: set[str] = frozenset()) -> tuple[Forecast, bool] | None:
    """The pending plan predicted best now, and whether to run it (False: skipped, reason set).

    A plan predicted within ``noise`` of the best measured step with the fused share of a measured plan of its
    mode (a tie: the prediction cannot tell them apart) is measured when its mode is in ``cheap`` (its
    compiles are cheap), else skipped."""
    pending = [f for f in forecasts if f.status == "pending"]
    if not pending:
        return None
    calibrated = {m: efficiency(forecasts, m, base_ms) for m in {f.mode for f in forecasts}}
    for f in pending:
        eff = calibrated[f.mode]
        f.predicted_ms = predict_ms(f, base_ms, prior if eff is None else eff)
    f = min(pending, key=lambda x: (round(x.predicted_ms, 9), -x.fused_share, compile_order(x), x.segments, x.cuts))
    if f.trial_error:
        f.reason = f"the trial capture failed: {f.trial_error[:200]}"
        return f, False
    if f.fused_share < MIN_SHARE:
        f.reason = (f"covers {f.fused_share:.0%} of the eager step in fused segments (< {MIN_SHARE:.0%}): too little "
                    "to pay for a compile")
        return f, False
    if best_ms is not None and calibrated[f.mode] is not None and f.predicted_ms >= best_ms * (1 - noise):
        twin = next((m for m in forecasts if m.mode == f.mode and m.status == "measured" and m.passed
                     and abs(m.fused_share - f.fused_share) <= SAME_SHARE), None)
        if f.predicted_ms < best_ms * (1 + noise) and twin is not None:
            if f.mode in cheap:
                f.reason = (f"predicted {f.predicted_ms:.3f} ms ties the best measured plan ({best_name}, "
                            f"{best_ms:.3f} ms) within the noise threshold ({noise:.0%}) with the share of "
                            f"{twin.name} (the prediction cannot tell them apart); {f.mode} compiles cheaply: measured")
                return f, True
            f.reason = (f"predicted {f.predicted_ms:.3f} ms ties the best measured plan ({best_name}, "
                        f"{best_ms:.3f} ms) within the noise threshold ({noise:.0%}) with the share of "
                        f"{twin.name}, and {f.mode}'s compiles are "
                        f"not cheap (over {CHEAP_COMPILE:g}x plain torch.compile's compile time): skipped")
            return f, False
        f.reason = (f"predicted {f.predicted_ms:.3f} ms cannot beat the best measured plan ({best_name}, "
                    f"{best_ms:.3f} ms) by more than the noise threshold ({noise:.0%})")
        return f, False
    return f, True
