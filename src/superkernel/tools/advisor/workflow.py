"""``superkernel optimize``: analyse, try scope strategies, verify precision, measure, recommend, report.

The four steps of the adaptation workflow (docs/workflow.md), run in one process so every
number in the report was measured in the same run as its baselines.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from superkernel.tools.decode import DecodeSession, prepare, run_decode
from superkernel.tools.models import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model, looks_like_path
from superkernel.tools.advisor.analysis import Analysis, analyze
from superkernel.tools.advisor.chart import latency_chart
from superkernel.tools.advisor.compiling import MODES
from superkernel.tools.advisor.environment import choose_threads, hardware, pick_device, versions
from superkernel.util import OutputError, atomic_write, check_not_input
from superkernel.tools.advisor.measure import run_baselines, run_plan
from superkernel.tools.advisor.plan_file import PlanFile, write_plan
from superkernel.tools.advisor.progress import Reporter
from superkernel.tools.advisor.optimize_report import CHART_NAME, PLAN_NAME, REPORT_NAME, render
from superkernel.tools.advisor.predict import PRIOR_EFFICIENCY, Forecast, base_step_ms, forecasts_for
from superkernel.tools.advisor.profile import StepProfile, profile_step
from superkernel.tools.advisor.profile_chart import profile_chart
from superkernel.tools.advisor.profile_report import PROFILE_CHART_NAME
from superkernel.tools.advisor.run_log import LOG_NAME, RunLog
from superkernel.tools.advisor.retime import Interleaved, session_copy
from superkernel.tools.advisor.search import run_search
from superkernel.tools.advisor.results import (
    Recommendation, RunResult, decide, faster_reduce_overhead_baseline, fill_speedups, recommendable,
)
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.advisor.strategies import ScopePlan, StrategyChoice, parse_strategy, select_plans
from superkernel.util import exception_summary

RESULTS_NAME = "results.json"
LOGITS_NAME = "logits.safetensors"
OUTPUT_NAMES = (REPORT_NAME, CHART_NAME, PLAN_NAME, RESULTS_NAME, LOGITS_NAME, PROFILE_CHART_NAME, LOG_NAME)
#: Decode steps profiled per run (each pass: hooks + wall clock, then torch.profiler).
PROFILE_STEPS = 6


class WorkflowError(RuntimeError):
    """The run finished but has no usable result (nothing passed, nothing captured)."""


@dataclass
class OptimizeOptions:
    model: str = DEFAULT_MODEL
    strategy: str = "auto"
    modes: tuple[str, ...] = MODES
    steps: int = 32
    warmup: int = 4
    prompt_len: int = 32
    output: Path = Path("superkernel_out")
    custom_scopes: dict[str, list[str]] = field(default_factory=dict)
    options: str = ""
    seed: int = 0
    device: str = "auto"
    tolerance: float | None = None                      # None: by the model's dtype and quantization (precision.py)
    threads: int | None = None                          # None: auto (see environment.choose_threads)
    quiet: bool = False
    inputs: list[Path] = field(default_factory=list)   # files given by the user, never overwritten
    dtype: str | None = None                            # None: the checkpoint's dtype (float32 for zoo models)
    batch_size: int = 1
    search: str | None = None                           # strategies.SEARCHES; None: the strategy's default
    quantize: str | None = None                         # superkernel.tools.quantize.SCHEMES; None: float
    eval_text: Path | None = None                       # --eval-text; None: the shipped text (models with a tokenizer)
    group_size: int | None = None                       # int4-weight's group size (None: chosen for the model)


@dataclass
class Outcome:
    results: list[RunResult]
    recommended: RunResult | None                      # the recommended superkernel plan, if one is
    analysis: Analysis
    files: dict[str, Path]
    message: str
    decision: Recommendation | None = None             # plan, "use torch.compile", or none
    profile: StepProfile | None = None                 # the eager decode step's profile
    forecasts: list[Forecast] = field(default_factory=list)  # predicted vs measured, per plan and mode

    @property
    def has_recommendation(self) -> bool:
        return self.decision is not None and self.decision.kind != "none"


def validate_scopes(model: torch.nn.Module, plans: list[ScopePlan], options: str) -> None:
    """Fail fast on a bad glob or option before any compile (apply, then remove again)."""
    import superkernel

    for plan in plans:
        try:
            superkernel.apply_scopes(model, plan.scopes, options=options)
        finally:
            superkernel.remove_scopes(model)


def load_and_prepare(opts: OptimizeOptions, reporter: Reporter,
                     score_text: bool = False) -> tuple[LoadedModel, DecodeSession]:
    """Load, quantize, prefill. A model with a tokenizer decodes a real text teacher-forced (text_eval.py);
    ``score_text``: also its eager perplexity over the whole text (the optimize report's quality section)."""
    from superkernel.tools.advisor.text_eval import score_whole_text, text_for

    device = pick_device(opts.device)
    with reporter.task(f"loading {opts.model}"):
        loaded = load_model(opts.model, seed=opts.seed, device=device, dtype=opts.dtype)
    check_supported(loaded)
    loaded.text_eval = text = text_for(opts.eval_text, loaded)
    choose_threads(opts.threads, device, loaded.num_parameters)
    float_model = _quantize(opts, loaded, reporter)
    with reporter.task("prefill + reference token sequence (uncompiled)"):
        try:
            session = prepare(loaded.model, prompt_len=opts.prompt_len, steps=opts.steps, warmup=opts.warmup,
                              seed=opts.seed, device=device, batch=opts.batch_size,
                              text_ids=text.ids if text is not None else None)
        except ValueError as exc:
            if str(exc).startswith(_USAGE_ERRORS):
                raise  # bad lengths: a usage error
            raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}) cannot decode with a preallocated "
                                        f"transformers StaticCache: "
                                        f"{exception_summary(exc, 340, first_line=False)}") from exc
        except Exception as exc:
            raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}) cannot decode with a preallocated "
                                        f"transformers StaticCache: "
                                        f"{exception_summary(exc, 340, first_line=False)}") from exc
    if float_model is not None:
        from superkernel.tools.quantize import float_decode_logits, quantization_cost

        with reporter.task("quantization's own error (the float model fed the same tokens)"):
            float_logits = float_decode_logits(session, float_model)  # once: the cost's and the quality's reference
            loaded.quantization["cost"] = quantization_cost(session, float_logits)
            if text is not None:
                text.float_decode = float_logits
    if text is not None and score_text:
        with reporter.task(f"eager over the whole evaluation text ({text.ids.shape[0]} tokens)"):
            score_whole_text(text, loaded.model, float_model)
    del float_model
    return loaded, session


def resolved_tolerance(opts: OptimizeOptions, model: torch.nn.Module, eager: RunResult) -> OptimizeOptions:
    """``opts`` with its max-autotune tolerance set: the user's, else by the model's dtype and quantization and,
    for W8A8, eager's rounding floor measured with the baselines."""
    import dataclasses

    from superkernel.tools.advisor.precision import default_tolerance

    return opts if opts.tolerance is not None else dataclasses.replace(
        opts, tolerance=default_tolerance(model, eager.rounding_floor))


def _quantize(opts: OptimizeOptions, loaded: LoadedModel, reporter: Reporter) -> torch.nn.Module | None:
    """``--quantize``: quantize the loaded model in place; returns a float copy for the cost report (None: float)."""
    if not opts.quantize:
        return None
    import copy

    from superkernel.tools.quantize import quantize_model

    with reporter.task(f"quantizing ({opts.quantize})"):
        float_model = copy.deepcopy(loaded.model)
        info = quantize_model(loaded.model, opts.quantize, group_size=opts.group_size)
    loaded.quantization = info.to_dict()
    loaded.notes.append(f"quantized {opts.quantize} by torchao ({info.layers} linear layers)")
    return float_model


_USAGE_ERRORS = ("prompt length and steps", "warmup must be", "prompt_len + warmup", "batch must be")


class UnsupportedModelError(WorkflowError):
    """A model the decode harness cannot run (no decoder layers, a cache kind it cannot preallocate)."""


def check_supported(loaded: LoadedModel) -> None:
    """One clear line for architectures the harness cannot decode, before any prefill."""
    config = loaded.model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    if layers is None:
        layers = getattr(text, "n_layer", None)
    if layers is not None and int(layers) < 1:
        raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}) has {layers} decoder layers: there is no "
                                    "decode step to optimize")
    try:
        from transformers import StaticCache

        cache = StaticCache(config=config, max_cache_len=2)
    except Exception as exc:
        raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}): transformers cannot preallocate a "
                                    f"StaticCache for it ({exception_summary(exc, 240, first_line=False)})"
                                    ) from None
    kinds = {type(layer).__name__ for layer in cache.layers}
    attention = [layer for layer in cache.layers if hasattr(layer, "keys") or hasattr(layer, "max_cache_len")]
    if not attention:
        raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}): every layer is linear attention / "
                                    f"recurrent ({', '.join(sorted(kinds))}); the decode harness needs at least one "
                                    "attention layer in transformers' StaticCache to track the position")
    if not cache.layers:
        raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}) has no cache layers: there is no decode "
                                    "step to optimize")
    not_compileable = sorted(k for layer in cache.layers for k in [type(layer).__name__]
                             if getattr(layer, "is_compileable", True) is False)
    if not_compileable:
        raise UnsupportedModelError(f"{loaded.name} ({loaded.architecture}): cache layer kind(s) "
                                    f"{', '.join(dict.fromkeys(not_compileable))} cannot be compiled with static "
                                    f"shapes (layers: {', '.join(sorted(kinds))})")


def check_options(opts: OptimizeOptions) -> StrategyChoice:
    """Everything that can be checked before loading the model (one clear error, at once); returns the
    checked strategy and its search policy."""
    from superkernel.scope import parse_options

    choice = parse_strategy(opts.strategy, opts.search, opts.custom_scopes)
    bad_modes = [m for m in opts.modes if m not in MODES]
    if bad_modes or not opts.modes:
        raise ValueError(f"unknown mode(s) {bad_modes or opts.modes!r}; choose from {', '.join(MODES)}")
    if opts.tolerance is not None and not opts.tolerance > 0:
        raise ValueError(f"--tolerance must be > 0, got {opts.tolerance}")
    parse_options(opts.options)
    from superkernel.tools.models.loader import parse_dtype
    from superkernel.util import check_output_dir

    parse_dtype(opts.dtype)
    if opts.quantize is not None or opts.group_size is not None:
        from superkernel.tools.quantize import check_scheme

        if opts.quantize is None:
            from superkernel.runtime.quant_schemes import grouped_names

            raise ValueError(f"--group-size applies to --quantize {' / '.join(grouped_names())}")
        check_scheme(opts.quantize, opts.group_size)
    if not isinstance(opts.batch_size, int) or isinstance(opts.batch_size, bool) or opts.batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {opts.batch_size!r}")
    if opts.threads is not None and (not isinstance(opts.threads, int) or opts.threads < 1):
        raise ValueError(f"--threads must be an integer >= 1, got {opts.threads!r}")
    check_output_dir(opts.output)  # before the run, not after minutes of measuring
    for name in OUTPUT_NAMES:
        target = Path(opts.output) / name
        check_not_input(target, _inputs(opts))
        if target.is_dir():
            raise OutputError(f"--output {str(opts.output)!r}: {name} exists there as a directory")
    return choice


def optimize(opts: OptimizeOptions, reporter: Reporter | None = None) -> Outcome:
    """Run the whole workflow; raises on bad input, returns an Outcome (recommended may be None).

    Compiler output (Inductor's autotune tables, warnings) goes to ``<output>/superkernel.log``.
    """
    reporter = reporter or Reporter(quiet=opts.quiet)
    choice = check_options(opts)
    log = RunLog(Path(opts.output) / LOG_NAME, _inputs(opts))
    try:
        with log.capture():
            outcome = _optimize(opts, choice, reporter, log)
    except ModelLoadError:
        log.discard()  # refused before any work: nothing written
        raise
    finally:
        path = log.close()
    outcome.files["log"] = path
    return outcome


def _optimize(opts: OptimizeOptions, choice: StrategyChoice, reporter: Reporter, log: RunLog) -> Outcome:
    started = time.perf_counter()
    loaded, session = load_and_prepare(opts, reporter, score_text=True)
    structure = analyze_structure(loaded.model)
    plans = select_plans(choice, structure)
    validate_scopes(loaded.model, plans, opts.options)
    with reporter.task(f"analysing model structure, decode capture, trial capture of {len(plans)} plan(s)"
                       + ("" if opts.options else " (each also its exactness reference)")):
        # without scope options a trial capture is exactly a strategy's exactness reference: kept, not captured again
        analysis = analyze(loaded.name, session, plans=plans, references=not opts.options)
    reporter.note(f"[bold]{loaded.name}[/]: {analysis.architecture}, {analysis.structure.num_layers} layers, "
                  f"{analysis.structure.attention_kind} attention, {len(analysis.structure.moe_paths)} MoE layer(s); "
                  f"plans: {', '.join(p.strategy for p in plans)} x {', '.join(opts.modes)} (search: {choice.search})")

    # --search predicted and all time their kept plans interleaved with eager and torch.compile at the end
    # (a real-width step timed once, alone, drifted 8 % over one run); exhaustive keeps one timing each
    results = run_baselines(session, reporter, keep=choice.retimed)
    eager = results[0]
    opts = resolved_tolerance(opts, loaded.model, eager)
    inductor = next((r for r in results if r.name == "torch.compile" and not r.error), None)
    timer = (Interleaved(session, inductor.step, session.step_fn()) if inductor is not None and inductor.step is not None
             else None)
    with reporter.task("profiling the eager decode step"):
        profile = profile_step(session, session.step_fn(), structure=structure, steps=PROFILE_STEPS, log=log.stream)
    forecasts = forecasts_for(plans, tuple(opts.modes), profile, loaded.model, analysis.trials)
    prior = PRIOR_EFFICIENCY
    base_ms = base_step_ms(eager.median_ms, inductor.median_ms if inductor is not None else None)
    references: dict[str, torch.Tensor] = {t.plan.strategy: t.reference_logits for t in analysis.trials
                                           if t.reference_logits is not None}

    sessions: dict[str, DecodeSession] = {}  # each kept step's session (the report's answer decodes with the best)

    def measure(plan: ScopePlan, modes: tuple[str, ...]) -> list[RunResult]:
        """A plan's modes; with the timer (auto, a named strategy), on a session copy whose compiled steps are kept."""
        own = session_copy(session) if timer is not None else session

        def profile_plan(step, result):
            return profile_step(own, step, label=result.name, steps=PROFILE_STEPS, measured_ms=result.median_ms,
                                log=log.stream)

        out = run_plan(own, plan, modes, eager.logits, options=opts.options, tolerance=opts.tolerance,
                       reporter=reporter, references=references, profile=profile_plan, keep=timer is not None)
        for r in out:
            if timer is not None and r.step is not None and recommendable(r):
                timer.add(r.name, own, r.step)
                sessions[r.name] = own
        return out

    answers: list[Any] = []

    def answer_with_best(found: list[RunResult]) -> None:
        """The report's answer, by the plan the showdown makes best, while its step still runs (its decision is
        taken again below, with the drift; an answer by another plan is then dropped)."""
        both = results + found
        fill_speedups(both, eager, inductor)
        pick = decide(both)
        best = pick.plan if pick.kind == "plan" else None
        answers.append(_answer(loaded, session, best, sessions.get(best.name) if best is not None else None,
                               reporter))

    try:
        results += run_search(plans, tuple(opts.modes), forecasts, measure, base_ms=base_ms, prior=prior,
                              exhaustive=choice.every_plan, note=reporter.note, timer=timer,
                              base_compile_s=inductor.compile_s if inductor is not None else None,
                              baselines={"eager": eager, "torch.compile": inductor}, last_use=answer_with_best)
    finally:
        if timer is not None:
            timer.close()
        for r in results:
            r.step = None
    fill_speedups(results, eager, inductor)
    drift = eager_drift(session, eager, reporter)
    # with the showdown the steps compared were timed interleaved in the same rounds; the drift does not enter
    decision = decide(results, None if inductor is not None and inductor.timing == "interleaved" else drift)
    best = decision.plan if decision.kind == "plan" else None
    answer = next((a for a in answers if a is not None and best is not None and a.plan == best.name), None)

    search = {"policy": choice.search, "exhaustive": choice.every_plan, "prior_efficiency": prior, "base_ms": base_ms,
              "forecasts": forecasts}
    files = write_outputs(opts, loaded, session, analysis, results, decision, references, drift,
                          profile=profile, search=search, run_time=time_spent(reporter, started), answer=answer)
    return Outcome(results=results, recommended=best, analysis=analysis, files=files,
                   message=outcome_message(results, decision), decision=decision, profile=profile,
                   forecasts=forecasts)


def _answer(loaded: LoadedModel, session: DecodeSession, best: RunResult | None, own: DecodeSession | None,
            reporter: Reporter):
    """The recommended plan's answer to a chat question beside eager's (:mod:`.answer`), decoded by the step this
    run measured; None for a model without a chat template or a recommendation without a kept step."""
    if best is None or best.step is None or own is None:
        return None
    from superkernel.tools.advisor.answer import has_chat_template, real_answer

    tokenizer = loaded.tokenizer()
    if not has_chat_template(tokenizer):
        return None

    with reporter.task(f"a real answer: eager and {best.name} decode a chat question"):
        return real_answer(tokenizer, session, own, best.step, best.name)


def time_spent(reporter: Reporter, started: float) -> dict:
    """The run's wall time so far and each progress task's (``run_time`` in results.json, the report)."""
    wall = time.perf_counter() - started
    return {"wall_s": wall, "outside_tasks_s": max(0.0, wall - sum(s for _, s in reporter.phases)),
            "phases": [{"task": name, "seconds": seconds} for name, seconds in reporter.phases]}


def plans_summary(results: list[RunResult]) -> str:
    """Why each plan was not recommended (failed, errored, recompiled), one clause each."""
    out = []
    for r in results:
        if r.kind != "plan":
            continue
        if r.error:
            out.append(f"{r.name}: error ({r.error[:160]})")
        elif not r.passed:
            out.append(f"{r.name}: failed precision ({r.verdict.reason if r.verdict else '?'})")
        elif r.recompiles:
            out.append(f"{r.name}: recompiles in steady state ({r.recompile_reason[:200]})")
    return "; ".join(out)


def outcome_message(results: list[RunResult], decision: Recommendation) -> str:
    text = _outcome(results, decision)
    if decision.unsteady:
        return (f"the machine's speed changed during the run (eager, timed again at the end, moved by "
                f"{decision.noise:.0%}): plans measured at different times cannot be compared, so take this with "
                f"care and re-run on an idle machine. {text}")
    return text


def _outcome(results: list[RunResult], decision: Recommendation) -> str:
    plan_results = [r for r in results if r.kind == "plan"]
    if decision.kind == "plan":
        best = decision.plan
        text = (f"recommended: {best.name} — {best.median_ms:.3f} ms/step, {best.speedup_vs_eager or 0:.2f}x vs eager, "
                f"{best.speedup_vs_compile or 0:.2f}x vs torch.compile ({decision.reason})")
        ro = faster_reduce_overhead_baseline(results, best, decision.noise)
        if ro is not None:
            text += (f"; note: torch.compile(mode=\"reduce-overhead\") ran faster, {ro.median_ms:.3f} ms/step "
                     f"({best.median_ms / ro.median_ms:.2f}x this plan's time)")
        return text
    if decision.kind == "eager":
        return f"recommended: keep eager — {decision.reason}"
    if decision.kind == "torch.compile":
        inductor = decision.baseline
        eager_x = f", {inductor.speedup_vs_eager:.2f}x vs eager" if inductor.speedup_vs_eager else ""
        use = ('torch.compile(mode="reduce-overhead")' if decision.torch_compile_mode else "torch.compile")
        text = f"recommended: use {use} — {inductor.median_ms:.3f} ms/step{eager_x} ({decision.reason})"
        summary = plans_summary(results)
        return text + (f"; plans not recommended: {summary}" if summary else "")
    if plan_results and all(r.error for r in plan_results):
        return f"model cannot be captured: every plan failed to compile or run (first: {plan_results[0].error})"
    summary = plans_summary(results)
    return decision.reason + (f": {summary}" if summary else "")


def eager_drift(session: DecodeSession, eager: RunResult, reporter: Reporter) -> float | None:
    """Time eager once more after all plans: how much the machine's speed moved during the run.

    Plans are measured one after another (each needs a fresh Dynamo state), so a change in
    background load shows up as a shift between them; this number says how large it was.
    """
    first = eager.own_median_ms or eager.median_ms  # its first run (the showdown re-times it)
    if not first:
        return None
    with reporter.task("eager again (drift check)", total=session.total_steps) as update:
        again = run_decode(session, session.step_fn(), on_step=lambda done, total: update(done=done))
    return again.median_ms / first - 1


def write_outputs(opts: OptimizeOptions, loaded: LoadedModel, session: DecodeSession, analysis: Analysis,
                  results: list[RunResult], decision: Recommendation,
                  references: dict[str, torch.Tensor], drift: float | None = None, *,
                  profile: StepProfile | None = None, search: dict | None = None,
                  run_time: dict | None = None, answer: Any = None) -> dict[str, Path]:
    from superkernel.tools.advisor.plan_file import TORCH_COMPILE

    out = Path(opts.output)
    inputs = _inputs(opts)
    files: dict[str, Path] = {}
    plan_yaml = None
    best = decision.plan if decision.kind == "plan" else None
    marked = best if best is not None else (decision.baseline if decision.kind == "torch.compile" else None)
    if best is not None:
        plan = PlanFile(scopes=best.scopes, mode=best.mode, options=opts.options, model=loaded.name,
                        strategy=best.strategy, measured=_measured(best, results, session), inductor=best.inductor,
                        quantization=_plan_quantization(loaded))
    elif decision.kind == "torch.compile":
        plan = PlanFile(scopes={}, mode=decision.torch_compile_mode, model=loaded.name, strategy=None,
                        backend=TORCH_COMPILE,
                        measured={**_measured(decision.baseline, results, session), "why": decision.reason},
                        quantization=_plan_quantization(loaded))
    else:
        plan = None
    if plan is not None:
        files["plan"] = write_plan(out / PLAN_NAME, plan, inputs)
        plan_yaml = files["plan"].read_text()
    floor = results[0].rounding_floor if results else None  # eager's (W8A8)
    from superkernel.tools.advisor.text_eval import score_runs

    quality = score_runs(loaded.text_eval, session, results) if loaded.text_eval is not None else None
    title = f"{loaded.name}: decode step latency ({hardware(session.device).split(' (')[0]})"
    files["chart"] = atomic_write(out / CHART_NAME, latency_chart(results, marked, title), inputs)
    shown = best if best is not None else decision.plan   # the recommended plan, else the best passing one
    plan_profiles = [r.profile for r in results if r.profile is not None and r is shown]
    if profile is not None:
        files["profile_chart"] = atomic_write(out / PROFILE_CHART_NAME, profile_chart(
            profile, plan_profiles, f"{loaded.name}: where the decode step spends its time"), inputs)
    settings = {"strategy": opts.strategy, "search": search["policy"] if search else None, "modes": list(opts.modes), "options": opts.options, "steps": opts.steps,
                "warmup": opts.warmup, "prompt_len": opts.prompt_len, "batch_size": session.batch,
                "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", ""),
                "dtype_source": loaded.dtype_source, "dynamic_sources": session.dynamic_sources,
                "position_ids_passed": session.pass_position_ids,
                "full_length_attention_mask_passed": session.attention_mask is not None,
                "quantization": loaded.quantization}
    report = render(analysis=analysis, model_name=loaded.name, model_source=loaded.source, notes=loaded.notes,
                    results=results, recommended=marked, settings=settings, hardware=hardware(session.device),
                    versions=versions(), tolerance=opts.tolerance, floor=floor, plan_yaml=plan_yaml,
                    prefill_ms=session.prefill_seconds * 1e3, eager_drift=drift, decision=decision,
                    profile=profile, plan_profiles=[r.profile for r in results if r.profile is not None],
                    search=search, run_time=run_time, quality=quality, answer=answer)
    files["report"] = atomic_write(out / REPORT_NAME, report, inputs)
    payload = {"model": loaded.name, "hardware": hardware(session.device), "versions": versions(),
               "settings": settings, "tolerance": opts.tolerance, "prefill_ms": session.prefill_seconds * 1e3,
               "rounding_floor": floor.to_dict() if floor is not None else None,
               "recommended": decision.name, "recommendation": {"kind": decision.kind, "reason": decision.reason,
                                                                "noise_threshold": decision.noise},
               "eager_drift": drift, "results": [r.to_dict() for r in results], "quality": quality,
               "model_source": {"kind": loaded.source, "gguf": loaded.gguf},
               "run_time": run_time, "answer": answer.to_dict() if answer is not None else None,
               "profile": profile.to_dict() if profile is not None else None,
               "search": None if search is None else {
                   "policy": search["policy"], "exhaustive": search["exhaustive"],
                   "prior_efficiency": search["prior_efficiency"],
                   "base_ms": search["base_ms"],
                   "plans": [f.to_dict() for f in search["forecasts"]]}}
    files["results"] = atomic_write(out / RESULTS_NAME, json.dumps(payload, indent=2, default=str) + "\n", inputs)
    files["logits"] = atomic_write(out / LOGITS_NAME, _logits_bytes(results, references, session), inputs)
    return files


def _plan_quantization(loaded: LoadedModel) -> dict:
    """What a plan file records to quantize the model the same way (empty: float)."""
    q = loaded.quantization
    if not q:
        return {}
    return {"scheme": q["scheme"], **({"group_size": q["group_size"]} if q.get("group_size") else {})}


def _inputs(opts: OptimizeOptions) -> list[Path]:
    inputs = list(opts.inputs)
    model_dir = Path(opts.model).expanduser()
    if looks_like_path(opts.model) and model_dir.is_dir():
        inputs += list(model_dir.iterdir())
    return inputs


def _logits_bytes(results: list[RunResult], references: dict[str, torch.Tensor], session: DecodeSession) -> bytes:
    """Every run's decode logits, each strategy's exactness reference (``"<strategy> / reference"``)
    and the fed tokens, so every precision number in the report can be re-checked."""
    from safetensors.torch import save

    tensors = {r.name: r.logits.contiguous() for r in results if r.logits is not None}
    tensors.update({f"{name} / reference": t.contiguous() for name, t in references.items()})
    tensors["__tokens__"] = session.tokens.cpu().contiguous()
    # one tensor under several names (the strategies whose trials were read from one capture share its
    # reference) is written once per name: safetensors refuses shared storage
    seen: set[int] = set()
    for name, t in tensors.items():
        if t.data_ptr() in seen:
            tensors[name] = t.clone()
        seen.add(tensors[name].data_ptr())
    return save(tensors)


def _measured(best: RunResult, results: list[RunResult], session: DecodeSession) -> dict:
    eager = next(r for r in results if r.name == "eager")
    return {"decode_ms_median": round(best.median_ms, 4), "decode_ms_p90": round(best.p90_ms, 4),
            "batch_size": session.batch,
            "eager_ms_median": round(eager.median_ms, 4),
            "speedup_vs_eager": round(best.speedup_vs_eager or 0, 3),
            "speedup_vs_torch_compile": round(best.speedup_vs_compile or 0, 3),
            "max_abs_diff_vs_reference": best.vs_reference.max_abs if best.vs_reference else None,
            "hardware": hardware(session.device)}
