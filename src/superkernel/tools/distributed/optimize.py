"""``superkernel optimize --nproc N``: the workflow on a tensor-parallel job, one call per rank.

1. Rank 0 runs the single-process reference on the same cores (N x the per-rank
   threads): eager and every plan, unsharded. Its eager logits are the single-process
   reference and its tokens the sequence every rank is fed; both go to every rank.
2. Every rank loads the model, shards it by its tensor-parallel plan
   (:mod:`.tp`) and measures eager, torch.compile and every plan with the decode step
   timed on a barrier-synchronised clock (:mod:`.timing`). Precision is checked on every
   rank: reduce-overhead bit-identical to that rank's exactness reference, and every
   run within the tolerance of the single-process reference.
3. The collectives' share of the step is profiled for eager and the fastest plan.
4. Rank 0 gathers every rank's numbers and writes the report (:mod:`.report`); files
   are written only after every rank finished, each atomically.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from superkernel.tools.advisor.compiling import compile_inductor, compile_superkernel
from superkernel.tools.advisor.environment import choose_threads, hardware, pick_device, versions
from superkernel.tools.advisor.precision import allowed_abs, compare, judge
from superkernel.tools.advisor.strategies import StrategyChoice, select_plans
from superkernel.tools.advisor.workflow import OptimizeOptions, check_options, validate_scopes
from superkernel.tools.decode import DecodeSession, prepare, run_decode
from superkernel.tools.distributed import job as jobs
from superkernel.tools.distributed.timing import collective_share, job_step_ms, run_synced
from superkernel.tools.distributed.tp import apply_tensor_parallel, model_plan
from superkernel.util import exception_summary


@dataclass
class DistOptions:
    base: OptimizeOptions
    tp_plan: dict[str, str] | None = None      # None: the model's transformers plan
    tp_plan_source: str = "transformers tp_plan"
    profile_steps: int = 8
    inductor_baseline: bool = True             # torch.compile (TorchInductor) baseline of the sharded model
    write_files: bool = True                   # False (bench): the report goes to stdout, nothing is written


@dataclass
class RankRun:
    """One baseline or plan on one rank (JSON-able)."""

    name: str
    kind: str
    strategy: str | None = None
    mode: str | None = None
    step_seconds: list[float] = field(default_factory=list)
    compile_s: float | None = None
    segments: int | None = None
    cuts: list[str] = field(default_factory=list)
    bit_exact: bool | None = None               # reduce-overhead vs this rank's exactness reference
    vs_single_max_abs: float | None = None      # vs the single-process reference (uncompiled, unsharded)
    vs_single_top1: float | None = None
    passed: bool | None = None
    reason: str = ""
    error: str | None = None
    recompiles_timed: int | None = None         # Dynamo recompiles in this rank's timed steps (must be 0)
    recompiles_warmup: int | None = None
    recompile_reasons: list[str] = field(default_factory=list)

    def count(self, run: Any) -> None:
        """Take the run's Dynamo counts (recompiles after the first call, per phase)."""
        if run.dynamo is not None:
            self.recompiles_timed = run.dynamo.recompiles_timed
            self.recompiles_warmup = run.dynamo.recompiles_warmup
            self.recompile_reasons = list(run.dynamo.reasons)[:3]


def _log(job: jobs.Job, opts: DistOptions, text: str) -> None:
    if job.is_main and not opts.base.quiet:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def _threads(opts: DistOptions, device: torch.device, params: int) -> int:
    return choose_threads(opts.base.threads, device, params)


def single_process(opts: DistOptions, job: jobs.Job, device: torch.device,
                   choice: StrategyChoice) -> tuple[dict, dict[str, torch.Tensor]]:
    """Rank 0: the unsharded run on the same cores; returns (summary, tensors)."""
    from superkernel.tools.advisor.progress import Reporter
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.advisor.measure import run_plan
    from superkernel.tools.models import load_model

    o = opts.base
    loaded = load_model(o.model, seed=o.seed, device=device, dtype=o.dtype)
    if o.tolerance is None:  # by the model's dtype; every rank takes it from this summary
        from superkernel.tools.advisor.precision import default_tolerance

        o.tolerance = default_tolerance(loaded.model)
    per_rank = _threads(opts, device, loaded.num_parameters)
    torch.set_num_threads(per_rank * job.world_size)
    session = prepare(loaded.model, prompt_len=o.prompt_len, steps=o.steps, warmup=o.warmup, seed=o.seed,
                      device=device, batch=o.batch_size)
    plans = select_plans(choice, analyze_structure(loaded.model))
    validate_scopes(loaded.model, plans, o.options)
    quiet = Reporter(quiet=True)
    eager = run_decode(session, session.step_fn(), label="eager")
    runs = [{"name": "eager", "median_ms": eager.median_ms, "compile_s": 0.0, "passed": None}]
    if opts.inductor_baseline:
        try:
            inductor = run_decode(session, compile_inductor(session), label="torch.compile")
            runs.append({"name": "torch.compile", "median_ms": inductor.median_ms,
                         "compile_s": inductor.compile_seconds, "passed": None})
        except Exception as exc:
            runs.append({"name": "torch.compile", "median_ms": None, "compile_s": None, "passed": None,
                         "error": exception_summary(exc, 400, first_line=False)})
        torch._dynamo.reset()
    for plan in plans:
        for r in run_plan(session, plan, tuple(o.modes), eager.logits, options=o.options, tolerance=o.tolerance,
                          reporter=quiet):
            runs.append({"name": r.name, "median_ms": r.median_ms, "compile_s": r.compile_s, "passed": r.passed,
                         "error": r.error})
    summary = {"threads": per_rank * job.world_size, "threads_per_rank": per_rank, "runs": runs,
               "tolerance": o.tolerance,
               "plans": [{"strategy": p.strategy, "scopes": p.scopes} for p in plans],
               "architecture": loaded.architecture, "parameters": loaded.num_parameters,
               "prefill_ms": session.prefill_seconds * 1e3}
    return summary, {"tokens": session.tokens.cpu(), "reference": eager.logits}


def _judge_single(run: RankRun, logits: torch.Tensor, single: torch.Tensor, tolerance: float) -> tuple[bool, str]:
    diff = compare(logits, single)
    run.vs_single_max_abs, run.vs_single_top1 = diff.max_abs, diff.top1_agreement
    limit = allowed_abs(single, tolerance)
    if diff.max_abs <= limit:
        return True, f"max abs diff to the single-process reference {diff.max_abs:.3g} <= {limit:.3g}"
    return False, (f"max abs diff to the single-process reference {diff.max_abs:.3g} > {limit:.3g} "
                   f"(top-1 agreement {diff.top1_agreement:.0%})")


def _explain(run: RankRun, backend: Any) -> None:
    import superkernel

    ex = superkernel.explain(backend)
    run.segments = len(ex.segments)
    run.cuts = [f"{c.scope}: {c.op} ({c.reason})" for c in ex.cuts][:20]


def measure_rank(opts: DistOptions, job: jobs.Job, session: DecodeSession, plans, single: torch.Tensor
                 ) -> tuple[list[RankRun], dict[str, Any]]:
    """Eager, torch.compile and every plan x mode on this rank; returns (runs, collective share per run).

    Each run is profiled right after it was timed, while it is still compiled."""
    import superkernel

    o = opts.base
    runs: list[RankRun] = []
    eager = RankRun(name="eager", kind="baseline")
    run = run_synced(session, session.step_fn(), label="eager")
    eager.step_seconds, eager.compile_s = run.step_seconds, 0.0
    eager.count(run)
    eager.passed, eager.reason = _judge_single(eager, run.logits, single, o.tolerance)
    runs.append(eager)
    shares = {"eager": collective_share(session, session.step_fn(), steps=opts.profile_steps)}
    _log(job, opts, f"tensor-parallel eager: rank 0 {run.median_ms:.3f} ms/step")
    if opts.inductor_baseline:
        compiled = RankRun(name="torch.compile", kind="baseline")
        try:
            step = compile_inductor(session)
            run = run_synced(session, step, label="torch.compile")
            shares["torch.compile"] = collective_share(session, step, steps=opts.profile_steps)
            compiled.step_seconds, compiled.compile_s = run.step_seconds, run.compile_seconds
            compiled.count(run)
            compiled.passed, compiled.reason = _judge_single(compiled, run.logits, single, o.tolerance)
        except Exception as exc:
            compiled.error = exception_summary(exc, 400, first_line=False)
        runs.append(compiled)
        torch._dynamo.reset()
    for plan in plans:
        superkernel.apply_scopes(session.model, plan.scopes, options=o.options)
        try:
            ref_step, _ = compile_superkernel(session, "reduce-overhead", run_eagerly=True)
            reference = run_synced(session, ref_step, label="reference").logits
            for mode in o.modes:
                r = RankRun(name=f"{plan.strategy} / {mode}", kind="plan", strategy=plan.strategy, mode=mode)
                try:
                    step, backend = compile_superkernel(session, mode)
                    run = run_synced(session, step, label=r.name)
                except Exception as exc:
                    r.error = exception_summary(exc, 400, first_line=False)
                    runs.append(r)
                    continue
                r.step_seconds, r.compile_s = run.step_seconds, run.compile_seconds
                r.count(run)
                _explain(r, backend)
                verdict = judge(mode, compare(run.logits, reference), reference, o.tolerance)
                r.bit_exact = bool(torch.equal(run.logits, reference))
                ok, why = _judge_single(r, run.logits, single, o.tolerance)
                r.passed = verdict.passed and ok and not r.recompiles_timed
                r.reason = f"{verdict.reason}; {why}" + (f"; Dynamo recompiled {r.recompiles_timed} time(s) in the "
                                                         f"timed steps" if r.recompiles_timed else "")
                runs.append(r)
                shares[r.name] = collective_share(session, step, steps=opts.profile_steps)
                _log(job, opts, f"{r.name}: rank 0 {run.median_ms:.3f} ms/step, compile {r.compile_s:.1f} s, "
                                f"{'passed' if r.passed else 'FAILED'} on rank 0")
        finally:
            superkernel.remove_scopes(session.model)
            session.restore_cache()
            torch._dynamo.reset()
    return runs, shares


def _pick(gathered: list[dict], warmup: int) -> str | None:
    """The fastest plan that passed on every rank (job step time)."""
    names = [r["name"] for r in gathered[0]["runs"] if r["kind"] == "plan"]
    best, best_ms = None, None
    for name in names:
        per_rank = [next(r for r in g["runs"] if r["name"] == name) for g in gathered]
        if any(r["error"] or not r["passed"] for r in per_rank):
            continue
        ms = job_step_ms([r["step_seconds"] for r in per_rank], warmup)
        if best_ms is None or ms < best_ms:
            best, best_ms = name, ms
    return best


def run(opts: DistOptions) -> int:
    """One rank's whole part; returns the process exit status (0: a plan passed on every rank)."""
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.models import load_model

    o = opts.base
    choice = check_options(o)
    device = pick_device(o.device)
    job = jobs.join(device)
    device = job.device
    try:
        _log(job, opts, f"{job.world_size}-rank {job.backend} job: single-process reference on rank 0")
        if job.is_main:
            summary, tensors = single_process(opts, job, device, choice)
            jobs.broadcast_json(summary, job)
            data = jobs.broadcast_bytes(jobs.tensors_to_bytes(tensors), job)
        else:
            summary = jobs.broadcast_json(None, job)
            data = jobs.broadcast_bytes(None, job)
        tensors = jobs.tensors_from_bytes(data)
        o.tolerance = summary["tolerance"]
        torch.set_num_threads(summary["threads_per_rank"])
        loaded = load_model(o.model, seed=o.seed, device=device, dtype=o.dtype)
        plan_used = dict(opts.tp_plan) if opts.tp_plan is not None else model_plan(loaded.model)
        sharded = apply_tensor_parallel(loaded.model, plan_used, strict=opts.tp_plan is not None)
        session = prepare(loaded.model, prompt_len=o.prompt_len, steps=o.steps, warmup=o.warmup, seed=o.seed,
                          device=device, batch=o.batch_size)
        session.tokens = tensors["tokens"].to(device)
        plans = select_plans(choice, analyze_structure(loaded.model))
        _log(job, opts, f"sharded {len(sharded.applied)} modules/parameters, {sharded.collectives} collective "
                        f"hooks; plans: {', '.join(p.strategy for p in plans)} x {', '.join(o.modes)}")
        runs, mine_share = measure_rank(opts, job, session, plans, tensors["reference"].float())
        mine = {"rank": job.rank, "runs": [vars(r) for r in runs], "hardware": hardware(device)}
        gathered = jobs.gather_json(mine, job)
        shares = jobs.gather_json(mine_share, job)
        best = _pick(gathered, o.warmup)
        if job.is_main and opts.write_files:
            from superkernel.tools.distributed.report import write_report

            files = write_report(opts, job, summary, gathered, shares, best, plan_used, sharded,
                                 versions(), hardware(device))
            for key, path in files.items():
                print(f"  {key}: {path}", flush=True)
        elif job.is_main:
            from superkernel.tools.distributed.report import render, rows

            print(render(opts, job, summary, rows(gathered, summary, o.warmup), shares, best, plan_used, sharded,
                         versions(), hardware(device)), flush=True)
        torch.distributed.barrier(group=job.handoff)
        return 0 if best is not None else 1
    finally:
        jobs.leave()


def load_tp_plan(path: Path) -> dict[str, str]:
    """``--tp-plan FILE``: JSON or YAML mapping module/parameter glob -> style."""
    from superkernel.tools.distributed.tp import STYLES, TensorParallelError

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TensorParallelError(f"--tp-plan {str(path)!r}: {exc.strerror or exc}") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TensorParallelError(f"--tp-plan {str(path)!r} is neither YAML nor JSON: {exc}") from None
    if isinstance(data, dict) and "tp_plan" in data:
        data = data["tp_plan"]
    if not isinstance(data, dict) or not data or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in data.items()):
        raise TensorParallelError(f"--tp-plan {str(path)!r} must map module/parameter globs to styles "
                                  f"({', '.join(STYLES)}), e.g. 'model.layers.*.mlp.down_proj: rowwise'")
    unknown = sorted({v for v in data.values() if v not in STYLES})
    if unknown:
        raise TensorParallelError(f"--tp-plan {str(path)!r}: unknown style(s) {', '.join(unknown)}; "
                                  f"supported: {', '.join(STYLES)}")
    return data
