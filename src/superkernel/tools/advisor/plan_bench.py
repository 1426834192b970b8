"""``superkernel bench``: re-measure a superkernel.yaml plan against the baselines."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from superkernel.tools.advisor.measure import run_baselines, run_plan
from superkernel.tools.advisor.plan_file import SUPERKERNEL, read_plan
from superkernel.tools.advisor.progress import Reporter
from superkernel.tools.advisor.results import REDUCE_OVERHEAD_BASELINE, RunResult, fill_speedups
from superkernel.tools.advisor.strategies import ScopePlan
from superkernel.tools.advisor.workflow import OptimizeOptions, load_and_prepare, validate_scopes


@dataclass
class BenchOptions:
    config: Path
    model: str | None = None
    steps: int = 32
    warmup: int = 4
    prompt_len: int = 32
    seed: int = 0
    device: str = "auto"
    mode: str | None = None
    tolerance: float | None = None  # None: by the model's dtype and quantization (precision.default_tolerance)
    threads: int | None = None
    quiet: bool = False
    dtype: str | None = None
    batch_size: int = 1
    eval_text: Path | None = None  # None: the shipped text, for models with a tokenizer (text_eval.py)


@dataclass
class BenchOutcome:
    model: str
    results: list[RunResult] = field(default_factory=list)
    torch_compile_mode: str | None = None  # a ``backend: torch.compile`` plan's mode
    quantization: str | None = None        # the scheme the plan records and the model was quantized with

    @property
    def plan(self) -> RunResult:
        """The plan's result; for a ``backend: torch.compile`` plan, that torch.compile baseline (its mode's)."""
        plan = next((r for r in self.results if r.kind == "plan"), None)
        if plan is not None:
            return plan
        wanted = REDUCE_OVERHEAD_BASELINE if self.torch_compile_mode == "reduce-overhead" else "torch.compile"
        return next((r for r in self.results if r.name == wanted),
                    next(r for r in self.results if r.name == "torch.compile"))


def bench(opts: BenchOptions, reporter: Reporter | None = None) -> BenchOutcome:
    reporter = reporter or Reporter(quiet=opts.quiet)
    spec = read_plan(opts.config)
    model = opts.model or spec.model
    if not model:
        raise ValueError(f"{opts.config} names no model; pass --model NAME|PATH")
    quant = spec.quantization or {}
    loaded, session = load_and_prepare(
        OptimizeOptions(model=model, steps=opts.steps, warmup=opts.warmup, prompt_len=opts.prompt_len,
                        seed=opts.seed, device=opts.device, threads=opts.threads, dtype=opts.dtype,
                        batch_size=opts.batch_size, quantize=quant.get("scheme"), group_size=quant.get("group_size"),
                        eval_text=opts.eval_text),
        reporter)
    results = run_baselines(session, reporter)
    eager = results[0]
    if spec.backend != SUPERKERNEL:  # "use torch.compile": the baselines are the whole measurement
        fill_speedups(results, eager, next((r for r in results if r.name == "torch.compile" and not r.error), None))
        return BenchOutcome(model=loaded.name, results=results, torch_compile_mode=spec.mode,
                            quantization=quant.get("scheme"))
    plan = ScopePlan(spec.strategy or "custom", spec.scopes)
    validate_scopes(loaded.model, [plan], spec.options)
    from superkernel.tools.advisor.precision import default_tolerance

    tolerance = opts.tolerance if opts.tolerance is not None else default_tolerance(loaded.model, eager.rounding_floor)
    results += run_plan(session, plan, (opts.mode or spec.mode,), eager.logits, options=spec.options,
                        tolerance=tolerance, reporter=reporter)
    fill_speedups(results, eager, next((r for r in results if r.name == "torch.compile" and not r.error), None))
    return BenchOutcome(model=loaded.name, results=results, quantization=quant.get("scheme"))
