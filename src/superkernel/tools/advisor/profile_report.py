"""Report sections of the profile (where the step spends its time) and of the plan search."""

from __future__ import annotations

from superkernel.tools.advisor.predict import MIN_SHARE, Forecast
from superkernel.tools.advisor.profile import KINDS, StepProfile

PROFILE_CHART_NAME = "decode_profile.png"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def profile_lines(eager: StepProfile, plans: list[StepProfile] = (), *, chart: bool = True) -> list[str]:
    """Per module kind and per layer: time, share, operators, launches, weights; the top modules."""
    step = eager.step_ms or float("nan")
    out = [f"The eager decode step under `torch.profiler` at the run's shapes ({eager.steps} steps): "
           f"{eager.ops:.0f} ATen operators and {eager.launches:.0f} launches per step, "
           f"{_mib(eager.weight_bytes)} MiB of weights. Times per module come from forward hooks reading a wall "
           f"clock (the profiler's per-operator cost would inflate a launch-bound step); they add up to "
           f"{eager.step_ms:.3f} ms per step, {eager.coverage:.2f}x the step timed without hooks "
           f"({eager.measured_ms:.3f} ms).", "",
           "| kind | ms / step | share | operators | launches | weights MiB read | scope that covers it |",
           "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        rows = [r for r in eager.rows if r.kind == kind]
        if not rows:
            continue
        ms = sum(r.ms for r in rows)
        cover = rows[0].covered_by or "none built in (custom scope)"
        if kind == "other":
            cover = "decoder_layer / all_layers for the layers' own glue; none outside the layers"
        out.append(f"| {kind} | {ms:.3f} | {ms / step:.1%} | {sum(r.ops for r in rows):.0f} | "
                   f"{sum(r.launches for r in rows):.0f} | {_mib(sum(r.weight_bytes for r in rows))} | {cover} |")
    out += ["", "Top modules (per layer), slowest first:", "",
            "| module | layer | ms / step | share | launches | scope that covers it |", "|---|---|---|---|---|---|"]
    for r in eager.top(8):
        where = "-" if r.layer is None else str(r.layer)
        names = ", ".join(f"`{m}`" for m in r.modules[:2]) or "(outside every marked module)"
        cover = r.covered_by or ("decoder_layer / all_layers" if r.layer is not None else "none built in")
        out.append(f"| {r.kind}: {names} | {where} | {r.ms:.3f} | {r.ms / step:.1%} | {r.launches:.0f} | {cover} |")
    if plans:
        out += ["", "The same step compiled with measured plans (profiled whole: a compiled step keeps no module "
                "boundaries):", "", "| run | ms / step (profiled) | measured median ms | operators | launches | "
                "launches vs eager |", "|---|---|---|---|---|---|"]
        for p in plans:
            out.append(f"| `{p.label}` | {p.step_ms:.3f} | {p.measured_ms:.3f} | {p.ops:.0f} | {p.launches:.0f} | "
                       f"{p.launches / eager.launches:.2f}x |" if eager.launches else "| - |")
    if chart:
        out += ["", f"![where the decode step spends its time]({PROFILE_CHART_NAME})"]
    return out


def search_lines(forecasts: list[Forecast], eager_ms: float, prior: float, policy: str,
                 base_ms: float | None = None, results: list | None = None) -> list[str]:
    """The report's plan table; ``policy``: the run's ``--search`` (strategies.SEARCHES)."""
    from superkernel.tools.advisor.strategies import EXHAUSTIVE, PREDICTED

    tried = [f for f in forecasts if f.status == "measured"]
    skipped = [f for f in forecasts if f.status == "skipped"]
    how = {PREDICTED: f"`--search {PREDICTED}`: {len(tried)} of {len(forecasts)} plan(s) measured, {len(skipped)} "
                      "skipped, tried in order of predicted gain",
           EXHAUSTIVE: f"`--search {EXHAUSTIVE}`: every plan was measured, each once in its own run"}.get(
        policy, f"`--search {policy}`: every plan was measured, then timed again in the showdown")
    base = f"plain torch.compile's step ({base_ms:.3f} ms)" if base_ms else "plain torch.compile's step"
    out = [f"{how}. Prediction: {base} x (1 - covered share x fused fraction x scope efficiency of the mode): "
           "every plan compiles the whole step, scoped or not, so its base is the step compiled without scopes; "
           f"the scopes then remove a part of the time they cover. Efficiency before a plan of the mode ran = "
           f"{prior:.0%} (every plan predicted at the base, the widest fused share first), then the best a measured "
           "plan of the mode reached (negative when its plans ran slower than the plain compile: narrower scopes are then predicted "
           f"to do better). Plans fusing under {MIN_SHARE:.0%} of the step are skipped; the search stops when no "
           "remaining plan is predicted to beat the best measured plan by more than the noise threshold; a plan "
           "predicted within it (a tie) is measured when its mode compiles cheaply."
           + ("" if policy == EXHAUSTIVE else " A measured step: the median over rounds timed interleaved with "
              "plain torch.compile (plan / torch.compile x its step); a plan's own run is shown beside it; the "
              "plans close to the best were timed together once more at the end (showdown)."), "",
           "| plan | covered share | fused fraction | launches removed | segments | cuts | predicted first | "
           "predicted when decided | measured | own run / rounds / compile s | status |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def x(ms):
        return f"{ms:.3f} ms ({eager_ms / ms:.2f}x)" if ms else "-"

    own = {r.name: r.own_median_ms for r in results or []}
    for f in forecasts:
        status = f.status + (f": {f.reason}" if f.reason else "")
        if f.remeasured:
            status += f"; timed again: {f.remeasured}"
        if f.showdown_ms:
            status += "; in the showdown"
        timing = "-"
        if f.status == "measured":
            timing = (f"{own[f.name]:.3f} ms / {f.rounds}" if own.get(f.name) else "- / -") + (
                f" / {f.compile_s:.1f}" if f.compile_s else " / -")
        out.append(f"| `{f.name}` | {f.share:.0%} | {f.fused_fraction:.0%} | {f.launches_removed} | {f.segments} | "
                   f"{f.cuts} | {x(f.prior_ms)} | {x(f.predicted_ms)} | {x(f.measured_ms)} | {timing} | {status} |")
    errors = [abs(f.predicted_ms / f.measured_ms - 1) for f in tried if f.measured_ms and f.predicted_ms]
    if errors:
        out += ["", f"Prediction error on the measured plans (predicted when decided vs measured): median "
                f"{sorted(errors)[len(errors) // 2]:.0%}, worst {max(errors):.0%}."]
    return out
