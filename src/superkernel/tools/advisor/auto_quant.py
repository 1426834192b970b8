"""``optimize --quantize auto``: the fastest plan whose quality stays within a KL budget (issue 58).

Three steps in one process:

1. **Screen.** The float model decodes the run's tokens uncompiled (teacher-forced over the evaluation text when the
   model has a tokenizer); each scheme the device runs quantizes a copy and decodes the same tokens: KL divergence
   from the float model (mean, 99th percentile), top-1 agreement and perplexity. A scheme over the budget, or one
   that cannot take the model (an int4 group size dividing no width), is never compiled: compiling is the expensive
   part, and its quality does not change with the plan.
2. **Search.** The float model and every scheme within the budget run the whole workflow, each in its own folder
   ``<output>/<candidate>/`` (report, chart, plan, results): baselines, plans, precision gates as for one
   ``--quantize``.
3. **Choose.** The fastest recommended step among them (the plan, torch.compile or eager that its own run
   recommends); a step within the runs' noise of a faster one but with less KL wins (speed that the timer cannot
   tell apart is not worth quality). ``<output>/superkernel.yaml`` is the chosen candidate's plan, which records its scheme,
   so ``bench --config`` and ``apply_for_generate`` quantize the same way. The float eager step is timed at the
   start and again at the end: the runs are minutes apart, and that drift says how far their times compare.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkernel.runtime.quant_schemes import SCHEMES
from superkernel.util import OutputError, atomic_write, check_not_input, check_output_dir

#: ``--max-kl`` default, nats per position (mean KL from the float model over the evaluation text). Measured on
#: SmolLM2-135M over the shipped text (benchmarks/results/quality_smollm2-135m.md): bfloat16 1.1e-3, int8-weight
#: 4.1e-3, w8a8 3.4e-2 (perplexity +4 %, top-1 88 %), w4a8 0.31 (perplexity +23 %, top-1 68 %); int4-weight 9.9e-4
#: on that GGUF file's own Q4_1 grid, 0.38 off it (group 64, int4 head). 0.05 keeps the int8 schemes, whose
#: perplexity moves by a few percent, and int4 where it is the file's own weights, and refuses an int4 rounding
#: that changes a third of the greedy picks.
DEFAULT_MAX_KL = 0.05
FLOAT = "float"
AUTO = "auto"
REPORT_NAME = "superkernel_optimization_report.md"  # the names of one optimize run's files
RESULTS_NAME = "results.json"
PLAN_NAME = "superkernel.yaml"


@dataclass
class Screened:
    """One candidate after the screen: its quality against the float model and whether it is compiled."""

    name: str                                  # "float" or a scheme's name
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1: float | None = None
    perplexity: float | None = None            # None: no evaluation text (a random-weight model)
    group_size: int | None = None
    skipped: str = ""                          # why it was not compiled ("" : it was)
    # filled by the search
    output: Path | None = None
    recommended: str | None = None             # the run's recommendation ("decoder_layer / max-autotune", ...)
    kind: str = ""                             # its Recommendation.kind
    step_ms: float | None = None               # the recommended step's median
    eager_ms: float | None = None
    compile_s: float | None = None
    noise: float | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output) if self.output is not None else None
        return out


@dataclass
class AutoOutcome:
    candidates: list[Screened]
    chosen: Screened
    max_kl: float
    message: str
    files: dict[str, Path] = field(default_factory=dict)
    drift: float | None = None

    @property
    def has_recommendation(self) -> bool:
        return self.chosen.kind not in ("", "none")


def check_max_kl(max_kl: Any) -> float:
    if isinstance(max_kl, bool) or not isinstance(max_kl, (int, float)) or not max_kl > 0:
        raise ValueError(f"--max-kl must be a number > 0 (nats per position), got {max_kl!r}")
    return float(max_kl)


def schemes_for(device: str) -> list[str]:
    """The schemes a run on ``device`` tries (every row of the scheme table that runs there)."""
    return [name for name, row in SCHEMES.items() if device in row.devices]


def _sub_options(opts: Any, name: str) -> Any:
    return dataclasses.replace(opts, quantize=None if name == FLOAT else name, group_size=None,
                               output=Path(opts.output) / name)


def check_auto_options(opts: Any, device: str) -> None:
    """Everything checkable before the model loads: each candidate's options and output folder, and ours."""
    from superkernel.tools.advisor.workflow import check_options

    if opts.group_size is not None:
        raise ValueError("--group-size does not apply to --quantize auto: each grouped scheme takes the size that "
                         "divides every layer (give --quantize a scheme to choose the size)")
    for name in (FLOAT, *schemes_for(device)):
        check_options(_sub_options(opts, name))
    check_output_dir(opts.output)
    for name in (REPORT_NAME, RESULTS_NAME, PLAN_NAME):
        target = Path(opts.output) / name
        check_not_input(target, list(opts.inputs))
        if target.is_dir():
            raise OutputError(f"--output {str(opts.output)!r}: {name} exists there as a directory")


def _quality(logits: Any, reference: Any, session: Any) -> dict[str, float | None]:
    from superkernel.tools.advisor.text_eval import first_sequence
    from superkernel.tools.quality import text_quality

    first, ref = first_sequence(logits, session), first_sequence(reference, session)
    text = session.text_targets
    q = text_quality(first, text if text is not None else ref.argmax(-1), ref)
    return {"kl_mean": q.kl_mean, "kl_p99": q.kl_p99, "top1": q.top1,
            "perplexity": q.perplexity if text is not None else None}


def screen(opts: Any, reporter: Any, max_kl: float) -> tuple[list[Screened], Any, Any, float]:
    """Step 1: the float model's decode, then each scheme's uncompiled decode of the same tokens.
    Returns the candidates, the float model's session (kept for the drift check) and its eager ms."""
    import torch

    from superkernel.tools.advisor.workflow import load_and_prepare
    from superkernel.tools.decode import run_decode
    from superkernel.tools.quantize import QuantizationError, quantize_model

    loaded, session = load_and_prepare(dataclasses.replace(opts, quantize=None, group_size=None), reporter)
    with reporter.task("float eager over the run's tokens (the reference of every scheme)"):
        with torch.no_grad():
            reference = run_decode(session, session.step_fn())
    out = [Screened(FLOAT, **_quality(reference.logits, reference.logits, session))]  # KL 0, top-1 1 exactly
    float_model = session.model
    for name in schemes_for(session.device.type):
        row = Screened(name)
        with reporter.task(f"screening {name}: quantize a copy, decode the same tokens uncompiled"):
            model = copy.deepcopy(float_model)
            try:
                info = quantize_model(model, name)
            except QuantizationError as exc:
                row.skipped = f"cannot quantize this model: {exc}"
            else:
                row.group_size = info.group_size
                session.model = model
                try:
                    with torch.no_grad():
                        logits = run_decode(session, session.step_fn()).logits
                finally:
                    session.model = float_model
                for key, value in _quality(logits, reference.logits, session).items():
                    setattr(row, key, value)
                if row.kl_mean > max_kl:
                    row.skipped = f"over the budget: mean KL {row.kl_mean:.3g} > --max-kl {max_kl:g}"
            del model
        out.append(row)
    return out, loaded, session, reference.median_ms


def choose(candidates: list[Screened]) -> Screened:
    """Step 3: the fastest candidate with a recommended step; among those within the noise of the fastest, the one
    with the least KL. The float candidate when nothing else has a step."""
    usable = [c for c in candidates if not c.skipped and not c.error and c.step_ms is not None
              and c.kind not in ("", "none")]
    if not usable:
        return next(c for c in candidates if c.name == FLOAT)
    fastest = min(usable, key=lambda c: c.step_ms)
    noise = max((c.noise or 0.0) for c in usable)
    close = [c for c in usable if c.step_ms <= fastest.step_ms * (1 + noise)]
    return min(close, key=lambda c: (c.kl_mean or 0.0, c.step_ms))


def _search(opts: Any, candidates: list[Screened], reporter: Any) -> None:
    """Step 2: the whole workflow for every candidate the screen kept, each into its own folder."""
    from superkernel.tools.advisor.workflow import WorkflowError, optimize

    kept = [c for c in candidates if not c.skipped]
    for i, c in enumerate(kept, 1):
        sub = _sub_options(opts, c.name)
        reporter.note(f"[bold]candidate {i}/{len(kept)}: {c.name}[/] -> {sub.output}")
        c.output = Path(sub.output)
        try:
            outcome = optimize(sub, reporter)
        except (WorkflowError, ValueError, RuntimeError) as exc:
            if c.name == FLOAT:
                raise
            from superkernel.util import exception_summary

            c.error = exception_summary(exc, 300)
            continue
        d = outcome.decision
        c.kind, c.recommended, c.noise = d.kind, d.name, d.noise
        eager = next((r for r in outcome.results if r.name == "eager"), None)
        c.eager_ms = eager.median_ms if eager is not None else None
        chosen = {"plan": d.plan, "torch.compile": d.baseline, "eager": eager}.get(d.kind)
        if chosen is not None:
            c.step_ms, c.compile_s = chosen.median_ms, chosen.compile_s


def optimize_auto(opts: Any, reporter: Any = None, max_kl: float = DEFAULT_MAX_KL) -> AutoOutcome:
    """``optimize --quantize auto`` (see the module doc); raises on bad input before any work."""
    import torch

    from superkernel.tools.advisor.progress import Reporter
    from superkernel.tools.advisor.environment import pick_device
    from superkernel.tools.decode import run_decode

    reporter = reporter or Reporter(quiet=opts.quiet)
    max_kl = check_max_kl(max_kl)
    device = pick_device(opts.device)
    check_auto_options(opts, device.type)
    started = time.perf_counter()
    candidates, loaded, session, first_ms = screen(opts, reporter, max_kl)
    model_name = loaded.name
    _search(opts, candidates, reporter)
    with reporter.task("float eager again (how far the candidates' times compare)"):
        with torch.no_grad():
            again = run_decode(session, session.step_fn()).median_ms
    drift = again / first_ms - 1 if first_ms else None
    del session, loaded
    chosen = choose(candidates)
    message = _message(candidates, chosen, max_kl)
    outcome = AutoOutcome(candidates=candidates, chosen=chosen, max_kl=max_kl, message=message, drift=drift)
    outcome.files = _write(opts, outcome, model_name, time.perf_counter() - started)
    return outcome


def _message(candidates: list[Screened], chosen: Screened, max_kl: float) -> str:
    within = [c for c in candidates if c.name != FLOAT and not c.skipped]
    if not within:
        return (f"no quantization stays within --max-kl {max_kl:g} on this model: the float plan "
                f"({chosen.recommended or 'nothing recommended'})")
    if chosen.kind in ("", "none"):
        return f"no candidate has a recommended step ({chosen.error or 'see the float run report'})"
    base = next(c for c in candidates if c.name == FLOAT)
    vs = (f", {base.step_ms / chosen.step_ms:.2f}x the float candidate's {base.step_ms:.3f} ms"
          if base.step_ms and chosen.name != FLOAT else "")
    kl = f"mean KL {chosen.kl_mean:.2e}" if chosen.name != FLOAT else "no quantization error"
    return (f"recommended: {chosen.name} + {chosen.recommended} — {chosen.step_ms:.3f} ms/step{vs}; {kl} "
            f"(budget {max_kl:g})")


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def table_lines(candidates: list[Screened], chosen: Screened) -> list[str]:
    """Speed against quality, one row per candidate (the report's table)."""
    lines = ["| candidate | mean KL | KL p99 | top-1 vs float | perplexity | recommended step | ms/step | "
             "compile s | eager ms | note |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for c in candidates:
        name = f"**{c.name}**" if c is chosen else c.name
        if c.group_size:
            name += f" (group {c.group_size})"
        note = c.skipped or c.error or ("chosen" if c is chosen else "")
        lines.append(f"| {name} | {_cell(c.kl_mean, '.2e')} | {_cell(c.kl_p99, '.2e')} | {_cell(c.top1, '.1%')} | "
                     f"{_cell(c.perplexity, '.3f')} | {c.recommended or ''} | {_cell(c.step_ms, '.3f')} | "
                     f"{_cell(c.compile_s, '.1f')} | {_cell(c.eager_ms, '.3f')} | {note} |")
    return lines


def _write(opts: Any, outcome: AutoOutcome, model_name: str, wall_s: float) -> dict[str, Path]:
    out, inputs = Path(opts.output), list(opts.inputs)
    files: dict[str, Path] = {}
    chosen = outcome.chosen
    plan = chosen.output / PLAN_NAME if chosen.output is not None else None
    if plan is not None and plan.is_file():
        files["plan"] = atomic_write(out / PLAN_NAME, plan.read_text(), inputs)
    drift = ("" if outcome.drift is None else
             f" The float model's eager step, timed before the first candidate and after the last, moved by "
             f"{outcome.drift:+.1%}: times of candidates closer than that are not told apart.")
    lines = [f"# superkernel optimize --quantize auto: {model_name}", "",
             outcome.message, "",
             f"Each scheme this device runs quantized a copy of the float model and decoded the run's tokens "
             f"uncompiled; its KL divergence from the float model (nats per position) screened it against the budget "
             f"--max-kl {outcome.max_kl:g}. The float model and every scheme within it then ran the whole workflow, "
             f"each in its own folder with its own report; the fastest recommended step wins, and among steps within "
             f"the runs' noise of it, the one with the least KL.{drift}", "",
             *table_lines(outcome.candidates, chosen), "",
             "Each candidate's report: " + ", ".join(f"[{c.name}]({c.name}/{REPORT_NAME})"
                                                     for c in outcome.candidates if c.output is not None) + ".", ""]
    if "plan" in files:
        lines += [f"`{PLAN_NAME}` here is {chosen.name}'s plan; it records the quantization, so "
                  f"`superkernel bench --config {PLAN_NAME}` and `apply_for_generate` quantize the model the same "
                  "way.", ""]
    lines.append(f"Wall time of the whole run: {wall_s:.0f} s.")
    files["report"] = atomic_write(out / REPORT_NAME, "\n".join(lines) + "\n", inputs)
    payload = {"model": model_name, "max_kl": outcome.max_kl, "chosen": chosen.name, "message": outcome.message,
               "eager_drift": outcome.drift, "wall_s": wall_s,
               "candidates": [c.to_dict() for c in outcome.candidates]}
    files["results"] = atomic_write(out / RESULTS_NAME, json.dumps(payload, indent=2) + "\n", inputs)
    return files


__all__ = ["AUTO", "AutoOutcome", "DEFAULT_MAX_KL", "Screened", "check_max_kl", "choose", "optimize_auto",
           "schemes_for", "table_lines"]
