"""``superkernel_optimization_report.md``: the report of step four of the adaptation workflow."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from superkernel.tools.advisor import text_eval
from superkernel.tools.advisor.analysis import Analysis
from superkernel.tools.advisor.precision import MAX_AUTOTUNE_TOLERANCE, W8A8_TOLERANCE
from superkernel.tools.advisor.results import (
    NOISE_FLOOR, UNSTEADY_DRIFT, RunResult, faster_reduce_overhead_baseline,
)
from superkernel.tools.advisor.strategies import DESCRIPTIONS
from superkernel.tools.advisor.table import fmt_diff, markdown_table

CHART_NAME = "decode_latency.png"
REPORT_NAME = "superkernel_optimization_report.md"
PLAN_NAME = "superkernel.yaml"


def _latency_change(base: float, new: float) -> str:
    change = (base - new) / base * 100
    return f"{change:.1f}% lower" if change >= 0 else f"{-change:.1f}% higher"


def structure_section(a: Analysis) -> list[str]:
    s = a.structure
    out = [f"- Architecture: `{a.architecture}`, {a.num_parameters / 1e6:.2f} M parameters",
           f"- Decoder layers: {s.stack_description} (`{s.layers[0].cls if s.layers else '-'}`)",
           f"- Attention: {s.attention_kind}, modules `{s.layers[0].attention if s.layers else '-'}` ...",
           f"- Dense MLP layers: {len(s.mlp_paths)}; MoE layers: {len(s.moe_paths)}",
           f"- Prefill / decode: {a.prefill_decode}",
           f"- KV cache: {a.kv_cache}",
           f"- Decode step capture (unscoped, torch._dynamo.explain): {a.decode_graphs} graph(s), "
           f"{len(a.breaks)} graph break(s)"]
    for b in a.breaks:
        out.append(f"  - break{' at `' + b.where + '`' if b.where else ''}: {b.reason}")
    out += ["", "| layer | attention | feed-forward | kind | router | experts | shared experts | norms |",
            "|---|---|---|---|---|---|---|---|"]
    for p in s.layers:
        out.append(f"| {p.index} | `{p.attention or '-'}` | `{p.ffn or '-'}` | {p.ffn_kind or '-'} | "
                   f"`{p.router or '-'}` | {('`' + p.experts + '`' + (f' ({p.num_experts})' if p.num_experts else '')) if p.experts else '-'} | "
                   f"`{p.shared_experts or '-'}` | {len(p.norms)} |")
    out += ["", f"Suggested order (seed decision tree): {' -> '.join(a.suggested_order)} — {a.suggestion_why}."]
    issues = a.issues
    out.append("Potential issues: " + ("none found in the decode capture." if not issues else ""))
    out += [f"- {issue}" for issue in issues]
    if a.not_applicable:
        out.append("Not applicable: " + "; ".join(f"`{k}` ({v})" for k, v in a.not_applicable.items()) + ".")
    return out


def cuts_section(results: list[RunResult]) -> list[str]:
    out = []
    plans = [r for r in results if r.kind == "plan"]
    for strategy in dict.fromkeys(r.strategy for r in plans):
        runs = [r for r in plans if r.strategy == strategy and not r.error]
        if not runs:
            continue
        first = runs[0]  # cuts and breaks come from the capture, the same in every mode
        out.append(f"- `{strategy}`: {len(first.cuts)} cut(s), {first.graph_breaks} graph break(s)")
        for c in first.cuts:
            out.append(f"  - scope `{c.scope}` cut at `{c.op}` (node {c.node_index})"
                       f"{' at `' + c.source + '`' if c.source else ''}: {c.reason}")
        if first.uncaptured:
            out.append(f"  - **not captured**: scope(s) {', '.join('`' + x + '`' for x in first.uncaptured)} reached "
                       "no captured graph (a graph break inside a scope can drop it), so they were not fused")
        for r in runs:
            realized = ", ".join(f"{k} x{v}" for k, v in r.realizations.items()) or "-"
            guards = ""
            if r.guard_path:
                costs = ", ".join(f"{k} {v:.1f} µs" for k, v in r.guard_cost_us.items())
                guards = f"; guard path {r.guard_path}{f' ({costs})' if costs else ''}"
            out.append(f"  - {r.mode}: {r.segments} segment(s), realized as {realized}{guards}")
            for f in r.fallbacks:
                out.append(f"    - fallback to eager: {f}")
    for r in results:
        if r.error:
            out.append(f"- `{r.name}` could not run: {r.error}")
    return out or ["- no plan was captured"]


def apply_section(best: RunResult, options: str, model_name: str) -> list[str]:
    scopes = ",\n    ".join(f"{label!r}: {globs if len(globs) > 1 else globs[0]!r}" for label, globs in best.scopes.items())
    return [
        "With the plan file written next to this report:", "",
        "```python",
        "import superkernel",
        "compiled = superkernel.apply(model, \"superkernel.yaml\")  # scopes applied in place, returns the compiled model",
        "# decode steps: compiled(input_ids=tok, cache=static_cache, cache_position=pos)  # past_key_values= before transformers 5.24",
        "# prefill: call the original model (scopes only act under torch.compile)",
        "```", "",
        "Or explicitly:", "",
        "```python",
        "import superkernel",
        f"superkernel.apply_scopes(model, {{\n    {scopes},\n}}, options={options!r})",
        "cfg = superkernel.CompilerConfig()",
        f"cfg.mode = {best.mode!r}",
        "compiled = superkernel.compile(model, cfg)",
        "```", "",
        f"Re-measure against the baselines: `superkernel bench --model {model_name} --config superkernel.yaml`",
    ]


def _quantization_line(info: dict[str, Any]) -> str:
    from superkernel.tools.quantize import describe_cost

    return describe_cost(info)


def floor_lines(floor: Any) -> list[str]:
    """W8A8's measured rounding floor (rounding_floor.py), when the run measured one."""
    if floor is None:
        return []
    return [f"- W8A8 rounding floor: eager with its `{floor.perturbed}` output one ulp off (seeded) differs from "
            f"eager by {floor.max_abs:.3g} ({floor.relative:.2g} of the logit scale, top-1 agreement "
            f"{floor.top1_agreement:.0%}): a correct plan's rounding can move the logits as far, so without "
            f"`--tolerance` max-autotune is judged at max({W8A8_TOLERANCE:g}, {floor.to_dict()['factor']:g} x floor)."]


def render(*, analysis: Analysis, model_name: str, model_source: str, notes: list[str], results: list[RunResult],
           recommended: RunResult | None, settings: dict[str, Any], hardware: str, versions: dict[str, str],
           tolerance: float, plan_yaml: str | None, prefill_ms: float, eager_drift: float | None = None,
           decision: Any = None, profile: Any = None, plan_profiles: list | None = None,
           search: dict | None = None, run_time: dict | None = None, floor: Any = None,
           quality: dict | None = None, answer: Any = None) -> str:
    eager = next((r for r in results if r.name == "eager"), None)
    inductor = next((r for r in results if r.name == "torch.compile"), None)
    plans = [r for r in results if r.kind == "plan"]
    lines = ["# SuperKernel optimization report", "",
             f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} by `superkernel optimize`.", "",
             "## Configuration", "",
             f"- Model: `{model_name}` ({model_source}{'; ' + '; '.join(notes) if notes else ''})",
             f"- Strategy: `{settings['strategy']}` ({DESCRIPTIONS.get(settings['strategy'], '')}); "
             f"modes: {', '.join(settings['modes'])}; scope options: `{settings['options'] or '(none)'}`",
             f"- Decode: batch {settings.get('batch_size', 1)}, dtype {settings.get('dtype', 'float32')} "
             f"({settings.get('dtype_source', 'default')}), prompt {settings['prompt_len']} tokens, {settings['warmup']} "
             f"warm-up + {settings['steps']} timed steps, teacher-forced (every plan is fed the same tokens), "
             "static KV cache restored completely before every run",
             *([f"- Dynamo: the cache's growing Python int(s) are dynamic sources (`{settings['dynamic_sources']}`), "
                "so the decode step compiles once instead of once per position"] if settings.get("dynamic_sources")
               else []),
             *([f"- Quantized: {_quantization_line(settings['quantization'])}. Every plan and baseline below runs "
                "the quantized model"] if settings.get("quantization") else []),
             f"- Prefill (once, uncompiled, unscoped): {prefill_ms:.2f} ms — not included in any decode number",
             f"- Hardware: {hardware}",
             f"- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), "",
             "## Step 1: model analysis", "", *structure_section(analysis), "",
             *_profile_sections(profile, plan_profiles or [], search, eager, results),
             "## Results", "",
             markdown_table(results, recommended), "",
             f"![decode step latency per plan]({CHART_NAME})", "",
             "Decode ms: median and p90 of the timed steps; compile s: the first call (tracing + compiling + one step). "
             "Speedups are eager or torch.compile median / plan median, all measured in this run. Recompiles: guard "
             "failures that made Dynamo compile again during the timed steps (measured from "
             "`torch._dynamo.utils.guard_failures`); a plan that recompiles is never recommended.", "",
             *recompile_section(results),
             "## Precision", "",
             "Every decode step's logits are compared, from the same prompt and cache state, with the exactness "
             "reference (the same scopes, captured graph run operator by operator: `debug.run_eagerly`) and with the "
             "uncompiled model.", "",
             "- `reduce-overhead` must be bit-identical to the reference (`torch.equal`, max abs diff 0).",
             f"- `max-autotune` passes when max abs diff <= {tolerance:g} x max(1, max |reference logit|) "
             "(`--tolerance`, else the default for the model's dtype and quantization).",
             *floor_lines(floor),
             "- The diff to the uncompiled model is reported, not judged: transformers takes other code paths under "
             "torch.compile, so the last bits may differ.", ""]
    for r in plans:
        if r.error:
            lines.append(f"- `{r.name}`: **ERROR** — {r.error}")
        elif r.verdict is not None:
            tag = "passed" if r.verdict.passed else "**FAILED**"
            lines.append(f"- `{r.name}`: {tag} — {r.verdict.reason}; vs eager: max abs diff "
                         f"{fmt_diff(r.vs_eager.max_abs)}, top-1 agreement {r.vs_eager.top1_agreement:.0%}")
    lines += ["", *text_eval.report_lines(quality)]
    from superkernel.tools.advisor.answer import report_lines as answer_lines

    lines += answer_lines(answer)
    lines += ["## Recommendation", ""]
    if decision is not None and decision.kind == "torch.compile":
        base = decision.baseline
        if decision.torch_compile_mode:
            lines += [f"**Use `torch.compile(mode=\"reduce-overhead\")`** (Inductor's kernels in one CUDA graph) — "
                      f"{decision.reason}.", "",
                      f"- torch.compile reduce-overhead: median decode step {base.median_ms:.3f} ms (p90 "
                      f"{base.p90_ms:.3f} ms)" + (f", {base.speedup_vs_eager:.2f}x vs eager." if base.speedup_vs_eager
                                                  else "."),
                      "- `superkernel.yaml` says `backend: torch.compile` and `mode: reduce-overhead`; "
                      "`superkernel.apply(model, \"superkernel.yaml\")` returns "
                      "`torch.compile(model, mode=\"reduce-overhead\")`."]
        else:
            lines += [f"**Use plain `torch.compile`** (default TorchInductor) — {decision.reason}.", "",
                      f"- torch.compile: median decode step {base.median_ms:.3f} ms (p90 {base.p90_ms:.3f} ms)"
                      + (f", {base.speedup_vs_eager:.2f}x vs eager." if base.speedup_vs_eager else "."),
                      f"- A superkernel plan is recommended only when it beats plain torch.compile by more than the "
                      f"noise threshold ({decision.noise:.1%}: the larger of {3:.0f}% and the eager drift of this "
                      "run) and is not slower than eager.",
                      "- `superkernel.yaml` says `backend: torch.compile`; `superkernel.apply(model, "
                      "\"superkernel.yaml\")` returns `torch.compile(model)`."]
        lines += [f"- `{r.name}`: {_not_recommended(r, base)}" for r in plans]
        lines += ["", "## Cuts, graph breaks and fallbacks", "", *cuts_section(results)]
        if plan_yaml:
            lines += ["", "`superkernel.yaml`:", "", "```yaml", plan_yaml.rstrip(), "```"]
    elif decision is not None and decision.kind == "eager":
        lines.append(f"**Keep eager** (no superkernel.yaml was written): {decision.reason}.")
        lines += [f"- `{r.name}`: {_not_recommended(r, inductor)}" for r in plans]
    elif recommended is None:
        lines.append("**No plan passed precision** (or compiled once): nothing is recommended and no "
                     "superkernel.yaml was written.")
        lines += [f"- `{r.name}`: {_not_recommended(r, inductor)}" for r in plans]
    else:
        lines += _why(recommended, plans, eager, inductor)
        ro = faster_reduce_overhead_baseline(results, recommended,
                                             decision.noise if decision is not None else NOISE_FLOOR)
        if ro is not None:
            lines.append(f"- Note: `torch.compile(mode=\"reduce-overhead\")` (Inductor's kernels in one CUDA graph) ran "
                         f"at {ro.median_ms:.3f} ms, faster than this plan ({recommended.median_ms / ro.median_ms:.2f}x "
                         "its time); the recommendation compares with plain torch.compile. On this GPU, weigh "
                         "that peer before deploying the plan.")
        lines += ["", "## Cuts, graph breaks and fallbacks", "", *cuts_section(results), "",
                  "## How to apply", "", *apply_section(recommended, settings["options"], model_name)]
        if plan_yaml:
            lines += ["", "`superkernel.yaml`:", "", "```yaml", plan_yaml.rstrip(), "```"]
    if recommended is None and not (decision is not None and decision.kind == "torch.compile"):  # eager / none
        lines += ["", "## Cuts, graph breaks and fallbacks", "", *cuts_section(results)]
    lines += ["", "## Notes", "",
              "- Absolute times hold for the hardware above only; ratios are the result. On a busy machine the "
              "median is the robust number, compare p90 for jitter."]
    if eager_drift is not None:
        size = abs(eager_drift)
        verdict = ("under 5%: the machine's speed stayed steady during the run" if size < 0.05 else
                   "differences between plans smaller than this are within the machine's drift"
                   if size <= UNSTEADY_DRIFT else
                   "**the machine was too busy to compare plans measured at different times: re-run on an idle "
                   "machine before acting on this report**")
        if any(r.timing == "interleaved" for r in results if r.kind == "baseline"):
            verdict = (f"{'under 5%' if size < 0.05 else 'the machine was busy'}; the steps the recommendation "
                       "compares were timed interleaved in the same rounds (auto search), so the drift does not "
                       "enter the comparison")
        lines.append(f"- Machine drift: eager was timed again after all plans, {eager_drift:+.1%} against its first "
                     f"median ({verdict}).")
    lines.append("- Decode steps use a preallocated StaticCache; prefill is never scoped or compiled.")
    lines += run_time_section(run_time)
    return "\n".join(lines) + "\n"


def run_time_section(run_time: dict | None) -> list[str]:
    """Where this run's wall time went: each progress task, then what ran outside them."""
    if not run_time or not run_time.get("phases"):
        return []
    total = run_time["wall_s"]
    out = ["", "## Where this run's time went", "",
           f"{total:.0f} s wall until the report was written. Each line is one progress task (a compile line "
           "includes its timed decode run; a reduce-overhead step is built before its first call, in its building "
           "line, the other modes compile in their first step); the search's interleaved re-timing rounds and "
           "showdown, Dynamo resets and writing the outputs are the rest.", "", "| task | s | share |", "|---|---:|---:|"]
    for phase in run_time["phases"]:
        out.append(f"| {phase['task']} | {phase['seconds']:.1f} | {phase['seconds'] / total:.0%} |")
    rest = run_time["outside_tasks_s"]
    out.append(f"| (outside the tasks above) | {rest:.1f} | {rest / total:.0%} |")
    return out


def _profile_sections(profile: Any, plan_profiles: list, search: dict | None, eager: RunResult | None,
                      results: list[RunResult]) -> list[str]:
    from superkernel.tools.advisor.profile_report import profile_lines, search_lines

    out = []
    if profile is not None:
        out += ["## Where the decode step spends its time", "", *profile_lines(profile, plan_profiles), ""]
    if search is not None and search["forecasts"] and eager is not None and eager.median_ms:
        out += ["## Plans: predicted vs measured gain", "",
                *search_lines(search["forecasts"], eager.median_ms, search["prior_efficiency"], search["policy"],
                              search.get("base_ms"), results),
                ""]
    return out


def _not_recommended(r: RunResult, inductor: RunResult | None) -> str:
    if r.error:
        return f"error — {r.error}"
    if not r.passed:
        return f"failed precision — {r.verdict.reason if r.verdict else '?'}"
    if r.recompiles:
        return f"recompiles in steady state — {r.recompile_reason}"
    if inductor is not None and inductor.median_ms and r.median_ms:
        return f"passed, {r.median_ms:.3f} ms/step = {inductor.median_ms / r.median_ms:.2f}x vs torch.compile"
    return "passed"


def recompile_section(results: list[RunResult]) -> list[str]:
    """Dynamo's own record of every run: recompiles and graph breaks, with the failing guard."""
    out = []
    for r in results:
        d = r.dynamo
        if d is None or r.name == "eager":
            continue
        if d.recompiles_timed or d.limit_hit or d.recompiles_warmup:
            out.append(f"- `{r.name}`: {d.recompiles_warmup} recompile(s) in the warm-up, {d.recompiles_timed} in the "
                       f"timed steps{' (recompile limit hit: the step ran uncompiled)' if d.limit_hit else ''}; "
                       f"guard: `{d.reasons[0] if d.reasons else '?'}`")
        if d.graph_breaks_first:
            out.append(f"- `{r.name}`: {d.graph_breaks_first} graph break(s) while compiling"
                       + (f": {d.break_reasons[0]}" if d.break_reasons else ""))
    if not out:
        return ["Dynamo: every compiled run compiled once (0 recompiles in the timed steps) without graph breaks.", ""]
    return ["Dynamo:", "", *out, ""]


def _why(best: RunResult, plans: list[RunResult], eager: RunResult | None, inductor: RunResult | None) -> list[str]:
    passing = [r for r in plans if r.passed]
    out = [f"**`{best.strategy}` in `{best.mode}` mode** — scopes: "
           + "; ".join(f"`{label}` = {', '.join('`' + g + '`' for g in globs)}" for label, globs in best.scopes.items()),
           "",
           f"- Fastest of {len(passing)} plan(s) that passed precision ({len(plans) - len(passing)} failed or errored): "
           f"median decode step {best.median_ms:.3f} ms (p90 {best.p90_ms:.3f} ms), {best.tokens_per_s:.0f} tokens/s.",
           f"- Precision: {best.verdict.reason}."]
    if eager is not None and eager.median_ms:
        out.append(f"- vs eager ({eager.median_ms:.3f} ms): {best.speedup_vs_eager:.2f}x, "
                   f"latency {_latency_change(eager.median_ms, best.median_ms)}, throughput "
                   f"{(best.tokens_per_s / eager.tokens_per_s - 1) * 100:+.1f}%.")
    if inductor is not None and inductor.median_ms and inductor.error:
        out.append(f"- vs plain torch.compile: no ratio, its output was not right ({inductor.error[:200]}).")
    elif inductor is not None and inductor.median_ms and best.speedup_vs_compile is not None:
        out.append(f"- vs plain torch.compile ({inductor.median_ms:.3f} ms): {best.speedup_vs_compile:.2f}x.")
        if best.median_ms > inductor.median_ms:
            out.append("- Note: plain torch.compile was faster than every passing superkernel plan in this run; "
                       "the plan is still the best scoped configuration.")
    if eager is not None and eager.median_ms and best.speedup_vs_eager and 1.0 <= best.speedup_vs_eager < 1.10:
        out.append("- Below the >10% improvement the adaptation guide asks of a scope choice: "
                   "keep eager or plain torch.compile unless this hardware differs.")
    if eager is not None and eager.median_ms and best.median_ms > eager.median_ms:
        out.append("- Note: this plan is slower than eager on this machine; do not deploy it here.")
    runner_up = sorted((r for r in passing if r is not best), key=lambda r: r.median_ms)[:1]
    for r in runner_up:
        tie = r.median_ms - best.median_ms <= best.p90_ms - best.median_ms
        out.append(f"- Runner-up: `{r.name}` at {r.median_ms:.3f} ms"
                   + (" — within the recommended plan's p90 spread, so practically a tie: rerun with more "
                      "--steps, or prefer the smaller scope." if tie else "."))
    return out
