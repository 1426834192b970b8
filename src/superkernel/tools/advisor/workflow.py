"""``superkernel optimize``: analyse, try scope strategies, verify precision, measure, recommend, report.

The four steps of the adaptation workflow (seed 001), run in one process so every
number in the report was measured in the same run as its baselines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from superkernel.tools.decode import DecodeSession, prepare, run_decode
from superkernel.tools.models import DEFAULT_MODEL, LoadedModel, load_model, looks_like_path
from superkernel.tools.advisor.analysis import Analysis, analyze
from superkernel.tools.advisor.chart import latency_chart
from superkernel.tools.advisor.compiling import MODES
from superkernel.tools.advisor.environment import choose_threads, hardware, pick_device, versions
from superkernel.util import atomic_write, check_not_input
from superkernel.tools.advisor.measure import run_baselines, run_plan
from superkernel.tools.advisor.plan_file import PlanFile, write_plan
from superkernel.tools.advisor.precision import MAX_AUTOTUNE_TOLERANCE
from superkernel.tools.advisor.progress import Reporter
from superkernel.tools.advisor.optimize_report import CHART_NAME, PLAN_NAME, REPORT_NAME, render
from superkernel.tools.advisor.results import RunResult, fill_speedups, recommend
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.advisor.strategies import STRATEGIES, ScopePlan, StrategyError, auto_plans, custom_plan, plan_for

RESULTS_NAME = "results.json"
LOGITS_NAME = "logits.safetensors"
OUTPUT_NAMES = (REPORT_NAME, CHART_NAME, PLAN_NAME, RESULTS_NAME, LOGITS_NAME)


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
    tolerance: float = MAX_AUTOTUNE_TOLERANCE
    threads: int | None = None                          # None: auto (see environment.choose_threads)
    quiet: bool = False
    inputs: list[Path] = field(default_factory=list)   # files given by the user, never overwritten


@dataclass
class Outcome:
    results: list[RunResult]
    recommended: RunResult | None
    analysis: Analysis
    files: dict[str, Path]
    message: str


def select_plans(strategy: str, analysis_structure, custom: dict[str, list[str]]) -> list[ScopePlan]:
    if strategy == "auto":
        return auto_plans(analysis_structure)
    if strategy == "custom":
        return [custom_plan(custom)]
    if strategy not in STRATEGIES:
        raise StrategyError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    return [plan_for(strategy, analysis_structure)]


def validate_scopes(model: torch.nn.Module, plans: list[ScopePlan], options: str) -> None:
    """Fail fast on a bad glob or option before any compile (apply, then remove again)."""
    import superkernel

    for plan in plans:
        try:
            superkernel.apply_scopes(model, plan.scopes, options=options)
        finally:
            superkernel.remove_scopes(model)


def load_and_prepare(opts: OptimizeOptions, reporter: Reporter) -> tuple[LoadedModel, DecodeSession]:
    device = pick_device(opts.device)
    with reporter.task(f"loading {opts.model}"):
        loaded = load_model(opts.model, seed=opts.seed, device=device)
    choose_threads(opts.threads, device, loaded.num_parameters)
    with reporter.task("prefill + reference token sequence (uncompiled)"):
        try:
            session = prepare(loaded.model, prompt_len=opts.prompt_len, steps=opts.steps, warmup=opts.warmup,
                              seed=opts.seed, device=device)
        except ValueError:
            raise  # bad lengths: a usage error
        except Exception as exc:
            raise WorkflowError(f"{loaded.name} cannot decode with a preallocated StaticCache: "
                                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc
    return loaded, session


def check_options(opts: OptimizeOptions) -> None:
    """Everything that can be checked before loading the model (one clear error, at once)."""
    from superkernel.scope import parse_options

    if opts.strategy not in STRATEGIES:
        raise StrategyError(f"unknown strategy {opts.strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if opts.strategy != "custom" and opts.custom_scopes:
        raise StrategyError("--scope/--scopes-file give scopes for --strategy custom; add --strategy custom")
    if opts.strategy == "custom":
        custom_plan(opts.custom_scopes)
    bad_modes = [m for m in opts.modes if m not in MODES]
    if bad_modes or not opts.modes:
        raise ValueError(f"unknown mode(s) {bad_modes or opts.modes!r}; choose from {', '.join(MODES)}")
    if not opts.tolerance > 0:
        raise ValueError(f"--tolerance must be > 0, got {opts.tolerance}")
    parse_options(opts.options)
    for name in OUTPUT_NAMES:  # before the run, not after minutes of measuring
        check_not_input(Path(opts.output) / name, _inputs(opts))


def optimize(opts: OptimizeOptions, reporter: Reporter | None = None) -> Outcome:
    """Run the whole workflow; raises on bad input, returns an Outcome (recommended may be None)."""
    reporter = reporter or Reporter(quiet=opts.quiet)
    check_options(opts)
    loaded, session = load_and_prepare(opts, reporter)
    plans = select_plans(opts.strategy, analyze_structure(loaded.model), opts.custom_scopes)
    validate_scopes(loaded.model, plans, opts.options)
    with reporter.task("analysing model structure and decode capture"):
        analysis = analyze(loaded.name, session, plans=[])
    reporter.note(f"[bold]{loaded.name}[/]: {analysis.architecture}, {analysis.structure.num_layers} layers, "
                  f"{analysis.structure.attention_kind} attention, {len(analysis.structure.moe_paths)} MoE layer(s); "
                  f"plans: {', '.join(p.strategy for p in plans)} x {', '.join(opts.modes)}")

    results = run_baselines(session, reporter)
    eager = results[0]
    references: dict[str, torch.Tensor] = {}
    for plan in plans:
        results += run_plan(session, plan, tuple(opts.modes), eager.logits, options=opts.options,
                            tolerance=opts.tolerance, reporter=reporter, references=references)
    inductor = next((r for r in results if r.name == "torch.compile" and not r.error), None)
    fill_speedups(results, eager, inductor)
    best = recommend(results)
    drift = eager_drift(session, eager, reporter)

    files = write_outputs(opts, loaded, session, analysis, results, best, references, drift)
    plan_results = [r for r in results if r.kind == "plan"]
    if plan_results and all(r.error for r in plan_results):
        message = f"model cannot be captured: every plan failed to compile or run (first: {plan_results[0].error})"
    elif best is None:
        failed = ", ".join(f"{r.name} ({r.verdict.reason if r.verdict else r.error})" for r in plan_results)
        message = f"no plan passed precision: {failed}"
    else:
        message = (f"recommended: {best.name} — {best.median_ms:.3f} ms/step, "
                   f"{best.speedup_vs_eager or 0:.2f}x vs eager, {best.speedup_vs_compile or 0:.2f}x vs torch.compile")
        slower = [name for name, x in (("eager", best.speedup_vs_eager), ("torch.compile", best.speedup_vs_compile))
                  if x is not None and x < 1]
        if slower:
            message += f" (the best plan that passed is slower than {' and '.join(slower)} on this machine)"
    return Outcome(results=results, recommended=best, analysis=analysis, files=files, message=message)


def eager_drift(session: DecodeSession, eager: RunResult, reporter: Reporter) -> float | None:
    """Time eager once more after all plans: how much the machine's speed moved during the run.

    Plans are measured one after another (each needs a fresh Dynamo state), so a change in
    background load shows up as a shift between them; this number says how large it was.
    """
    if not eager.median_ms:
        return None
    with reporter.task("eager again (drift check)", total=session.total_steps) as update:
        again = run_decode(session, session.step_fn(), on_step=lambda done, total: update(done=done))
    return again.median_ms / eager.median_ms - 1


def write_outputs(opts: OptimizeOptions, loaded: LoadedModel, session: DecodeSession, analysis: Analysis,
                  results: list[RunResult], best: RunResult | None,
                  references: dict[str, torch.Tensor], drift: float | None = None) -> dict[str, Path]:
    out = Path(opts.output)
    inputs = _inputs(opts)
    files: dict[str, Path] = {}
    plan_yaml = None
    if best is not None:
        plan = PlanFile(scopes=best.scopes, mode=best.mode, options=opts.options, model=loaded.name,
                        strategy=best.strategy, measured=_measured(best, results, session))
        files["plan"] = write_plan(out / PLAN_NAME, plan, inputs)
        plan_yaml = files["plan"].read_text()
    title = f"{loaded.name}: decode step latency ({hardware(session.device).split(' (')[0]})"
    files["chart"] = atomic_write(out / CHART_NAME, latency_chart(results, best, title), inputs)
    settings = {"strategy": opts.strategy, "modes": list(opts.modes), "options": opts.options, "steps": opts.steps,
                "warmup": opts.warmup, "prompt_len": opts.prompt_len}
    report = render(analysis=analysis, model_name=loaded.name, model_source=loaded.source, notes=loaded.notes,
                    results=results, recommended=best, settings=settings, hardware=hardware(session.device),
                    versions=versions(), tolerance=opts.tolerance, plan_yaml=plan_yaml,
                    prefill_ms=session.prefill_seconds * 1e3, eager_drift=drift)
    files["report"] = atomic_write(out / REPORT_NAME, report, inputs)
    payload = {"model": loaded.name, "hardware": hardware(session.device), "versions": versions(),
               "settings": settings, "tolerance": opts.tolerance, "prefill_ms": session.prefill_seconds * 1e3,
               "recommended": best.name if best else None, "eager_drift": drift,
               "results": [r.to_dict() for r in results]}
    files["results"] = atomic_write(out / RESULTS_NAME, json.dumps(payload, indent=2, default=str) + "\n", inputs)
    files["logits"] = atomic_write(out / LOGITS_NAME, _logits_bytes(results, references, session), inputs)
    return files


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
    return save(tensors)


def _measured(best: RunResult, results: list[RunResult], session: DecodeSession) -> dict:
    eager = next(r for r in results if r.name == "eager")
    return {"decode_ms_median": round(best.median_ms, 4), "decode_ms_p90": round(best.p90_ms, 4),
            "eager_ms_median": round(eager.median_ms, 4),
            "speedup_vs_eager": round(best.speedup_vs_eager or 0, 3),
            "speedup_vs_torch_compile": round(best.speedup_vs_compile or 0, 3),
            "max_abs_diff_vs_reference": best.vs_reference.max_abs if best.vs_reference else None,
            "hardware": hardware(session.device)}
