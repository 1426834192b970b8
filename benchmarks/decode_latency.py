"""Decode-step latency of the superkernel backend against its baselines, in one interleaved run.

    .venv/bin/python benchmarks/decode_latency.py [--model llama-tiny] [--steps 64] [--warmup 8] [--rounds 5]

Plans, all fed the same tokens from the same prompt and cache state (decode harness):

* eager (uncompiled);
* torch.compile with the default TorchInductor backend, with ``mode="lite"`` (torch's own
  bit-exact mode: every operator falls back to ATen; only where this torch has the mode),
  with ``freezing`` (weights folded and prepacked; CPU), with freezing and ``max_autotune``
  (Inductor's timed GEMM choices, its C++ templates included; CPU, not with ``--quick``),
  and on CUDA ``mode="reduce-overhead"``;
* superkernel in both modes with one scope per decoder layer and one scope around the
  layer stack.

Every plan is compiled first (compile time = its first step: tracing, compiling, one step),
each on its own copy of the step function's code object so Dynamo keeps every plan's graph
at once. Then the plans are timed in rounds; every round runs each plan once, in a
rotating order, so machine drift spreads over all of them. Reported per plan: median over
rounds of the per-run median step time (and p90), and the median over rounds of the
per-round ratios against eager, plain torch.compile, ``lite`` and freezing. Every
reduce-overhead plan is checked bit for bit (``torch.equal`` over all steps' logits)
against its exactness reference (the same scopes, ``debug.run_eagerly``) on every round.
Every timing round runs each plan on a **fresh** ``StaticCache`` prefilled with another
prompt (as a user's next ``generate()`` would): a peer that folded the cache it was compiled
with into its graph is right on the first run only. Every round of every plan is checked against
eager's logits of that round (``superkernel.tools.peer_check``); a plan wrong on any round
is marked WRONG, gets no ratios, and is not used as a baseline (``--trust-wrong-baselines``
keeps its ratio columns, flagged). Also printed:
the achieved fraction of the memory roofline (bytes of weights + KV cache read per step /
measured copy bandwidth). Writes benchmarks/results/decode_latency_<model>_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import superkernel as sk
from superkernel.timing import rotation
from superkernel.tools.advisor.compiling import guard_path_of, own_code
from superkernel.tools.advisor.environment import choose_threads
from superkernel.tools.advisor.environment import hardware as describe_hardware
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.decode import DecodeSession, prepare, run_decode
from superkernel.tools.fresh_cache import CacheHolder, fresh_cache, holder_step
from superkernel.tools.peer_check import PeerCheck, peer_tolerance
from superkernel.tools.models import load_model
from superkernel.tools.models.loader import looks_like_path
from superkernel.util import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ("eager", "torch.compile", "torch.compile lite", "torch.compile freezing",
             "torch.compile max-autotune freezing")


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large device-to-device copy (read + write), the best of a few."""
    from superkernel.runtime.inductor.autofusion.machine import measure_bandwidth

    return measure_bandwidth(megabytes, repeats, device)


def bytes_per_step(model: torch.nn.Module, session: DecodeSession) -> int:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(t.numel() * t.element_size() for layer in session.cache.layers
             for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))
    return weights + kv


class Plan:
    def __init__(self, label: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
                 scopes: dict[str, list[str]] | None = None, mode: str | None = None) -> None:
        self.label, self.make, self.scopes, self.mode = label, make, scopes, mode
        self.step: Callable[..., Any] | None = None
        self.backend: Any = None
        self.first = None
        self.runs: list[Any] = []
        self.error: str | None = None
        self.bit_exact: bool | None = None
        self.realizations: list[str] = []
        self.cpu_ms: list[float] = []  # per round: CPU time of this thread per step (not stretched by other processes)
        self.holder: CacheHolder | None = None  # the cache the step reads: a fresh one every round
        self.check: PeerCheck | None = None     # agreement with eager, every round
        self.exact_rounds: list[bool] = []      # reduce-overhead: torch.equal to the reference, every round


def superkernel_plan(label: str, mode: str, scopes: dict[str, list[str]], run_eagerly: bool = False,
                     skip_guards: bool = False) -> Plan:
    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        cfg = sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}})
        plan.backend = sk.get_backend(cfg)
        # Diagnostic only: with every Dynamo guard dropped, a changed model or input would
        # silently run the stale graph. It shows how much of a step is Dynamo's guard check.
        options = {"guard_filter_fn": torch.compiler.skip_all_guards_unsafe} if skip_guards else None
        return torch.compile(fn, backend=plan.backend, dynamic=False, options=options)

    plan = Plan(label, make, scopes, mode)
    return plan


def precompiled_plan(label: str, scopes: dict[str, list[str]], session: DecodeSession) -> Plan:
    """reduce-overhead as a precompiled step (``superkernel.precompile_step``): built once, then called without
    Dynamo's guard tree (a state watch; torch's frame guards when something changed; guarded fallback)."""
    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
        with torch.no_grad(), session.dynamo_config():
            step = sk.precompile_step(fn, session.inputs(0), cfg)
        from superkernel.pipeline.backend import find_backend

        plan.backend = find_backend(step)
        return step

    plan = Plan(label, make, scopes, "reduce-overhead")
    return plan


def inductor_plan(label: str, **kwargs: Any) -> Plan:
    return Plan(label, lambda fn: torch.compile(fn, dynamic=False, **kwargs))


def step_for(session: DecodeSession, model: torch.nn.Module, plan: Plan) -> Callable[..., Any]:
    """The session's decode step running ``model`` (a scoped copy) on ``plan.holder.cache``."""
    plan.holder = CacheHolder(session.cache)
    return holder_step(session, plan.holder, model)


def time_rounds(session: DecodeSession, live: list[Plan], rounds: int, references: dict[str, Plan],
                tolerance: float, log: Callable[[str], None] = print) -> None:
    """Time every plan once per round (rotating order), each run on a fresh cache, and check each run.

    Every run is compared with eager's run of the same round (:class:`PeerCheck`), and a
    reduce-overhead plan with its exactness reference's logits, bit for bit.
    """
    for plan in live:
        plan.check = PeerCheck(tolerance)
    eager = next(p for p in live if p.label == "eager")
    for r in range(rounds):
        order = [live[i] for i in rotation(len(live), r)]
        logits = {}
        seed = 1000 + r  # another prompt every round: a step holding on to an old cache shows
        for plan in order:
            if plan.holder is not None:
                plan.holder.cache = fresh_cache(session, seed=seed)
            cpu_start = time.thread_time()
            run = run_decode(session, plan.step, label=plan.label)
            plan.cpu_ms.append((time.thread_time() - cpu_start) / session.total_steps * 1e3)
            plan.runs.append(run)
            logits[plan.label] = run.logits
        for strategy, ref in references.items():  # untimed: the exactness reference of this round's prompt
            if ref.step is not None and ref.holder is not None:
                ref.holder.cache = fresh_cache(session, seed=seed)
                logits[ref.label] = run_decode(session, ref.step, label=ref.label).logits
        for plan in live:
            plan.check.check(logits[plan.label], logits[eager.label])
            ref = references.get(plan.label.split()[1]) if plan.mode == "reduce-overhead" else None
            if ref is not None and ref.label in logits:
                plan.exact_rounds.append(bool(torch.equal(logits[plan.label], logits[ref.label])))
        log(f"round {r + 1}/{rounds}: " + "  ".join(f"{p.label.replace('superkernel ', 'sk ')} {p.runs[-1].median_ms:.3f}"
                                                    + ("(WRONG)" if p.check.wrong else "") for p in live))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=7,
                        help="timing rounds; each runs every plan once (rotating order); medians over rounds are reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: 1 on CPU for tiny models, which keeps timings steady on a shared box)")
    parser.add_argument("--strategies", default="decoder_layer,all_layers")
    parser.add_argument("--quick", action="store_true",
                        help="leave out the slowest baseline to compile (torch.compile max-autotune with freezing)")
    parser.add_argument("--modes", default="reduce-overhead,max-autotune",
                        help="superkernel modes to run per strategy (comma-separated)")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help="baselines to run (comma-separated, from: %s); eager always runs" % ", ".join(BASELINES))
    parser.add_argument("--guard-diagnostic", action="store_true",
                        help="add, per strategy, reduce-overhead with every Dynamo guard skipped (unsafe; a "
                             "diagnostic of how much of a step the guard check takes, never a plan)")
    parser.add_argument("--no-precompiled", action="store_true",
                        help="leave out, per strategy, reduce-overhead as a precompiled step (superkernel.precompile_step)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="folder for the .json and .md results")
    parser.add_argument("--trust-wrong-baselines", action="store_true",
                        help="keep ratio columns against baselines whose output was wrong on some round (flagged)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    wanted = {b for b in args.baselines.split(",") if b} | {"eager"}
    unknown = sorted(set(modes) - {"reduce-overhead", "max-autotune"}) + sorted(wanted - set(BASELINES))
    if unknown:
        parser.error(f"unknown mode or baseline: {', '.join(unknown)}")

    device = torch.device(args.device)
    loaded = load_model(args.model, device=device)
    model = loaded.model
    threads = choose_threads(args.threads, device, loaded.num_parameters)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, device=device)
    structure = analyze_structure(model)

    plans = [Plan("eager", lambda fn: fn), inductor_plan("torch.compile")]
    if "lite" in torch._inductor.list_mode_options():
        plans.append(inductor_plan("torch.compile lite", mode="lite"))
    if device.type == "cpu":
        plans.append(inductor_plan("torch.compile freezing", options={"freezing": True}))
        if not args.quick:
            # Inductor at full effort for inference: frozen weights and timed GEMM choices (its C++ templates)
            plans.append(inductor_plan("torch.compile max-autotune freezing",
                                       options={"freezing": True, "max_autotune": True}))
    else:
        plans.append(inductor_plan("torch.compile reduce-overhead", mode="reduce-overhead"))
    plans = [p for p in plans if p.label in wanted or p.label not in BASELINES]
    references: dict[str, Plan] = {}
    # Scopes wrap module forwards, which Dynamo guards on; so each strategy gets its own scoped
    # copy of the model (same weights), left untouched while every plan's graph stays live.
    scoped: dict[str, torch.nn.Module] = {}
    for strategy in [s for s in args.strategies.split(",") if s]:
        scopes = plan_for(strategy, structure).scopes
        scoped[strategy] = copy.deepcopy(model)
        sk.apply_scopes(scoped[strategy], scopes)
        for mode in modes:
            plans.append(superkernel_plan(f"superkernel {strategy} {mode}", mode, scopes))
        if "reduce-overhead" in modes and not args.no_precompiled:
            plans.append(precompiled_plan(f"superkernel {strategy} reduce-overhead precompiled", scopes, session))
        if args.guard_diagnostic:
            plans.append(superkernel_plan(f"superkernel {strategy} reduce-overhead guards-skipped-diagnostic",
                                          "reduce-overhead", scopes, skip_guards=True))
        references[strategy] = superkernel_plan(f"reference {strategy}", "reduce-overhead", scopes, run_eagerly=True)

    # Compile every plan (its first run); each on its own code object.
    for i, plan in enumerate([*plans, *references.values()]):
        strategy = plan.label.split()[1] if plan.scopes else None
        base = step_for(session, scoped[strategy] if strategy else model, plan)
        try:
            made = time.perf_counter()
            plan.step = plan.make(own_code(base, f"plan{i}"))
            made = time.perf_counter() - made  # a precompiled step compiles here, before its first call
            session.restore_cache()
            plan.first = run_decode(session, plan.step, label=plan.label)
            plan.first.compile_seconds += made
        except Exception as exc:  # noqa: BLE001 - a baseline that fails to compile is reported, not fatal
            plan.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]
            print(f"{plan.label}: failed: {plan.error}", flush=True)
            continue
        if plan.backend is not None:
            plan.realizations = sorted({s.realization for s in sk.explain(plan.backend).segments})
        print(f"compiled {plan.label:<44} first step {plan.first.compile_seconds:7.2f} s", flush=True)
    for plan in plans:
        strategy = plan.label.split()[1] if plan.label.startswith("superkernel") else None
        ref = references.get(strategy) if plan.mode == "reduce-overhead" else None
        if ref is not None and plan.first is not None and ref.first is not None:
            plan.bit_exact = bool(torch.equal(plan.first.logits, ref.first.logits))

    # Timing rounds: every plan once per round, the order rotating, each run on a fresh cache and checked.
    live = [p for p in plans if p.step is not None]
    dtype = next(model.parameters()).dtype
    time_rounds(session, live, args.rounds, references, peer_tolerance(dtype), lambda line: print(line, flush=True))
    for plan in live:
        if plan.exact_rounds:
            plan.bit_exact = bool(plan.bit_exact is not False and all(plan.exact_rounds))

    wrong = {p.label for p in live if p.check.wrong}
    by_label = {p.label: p for p in live if args.trust_wrong_baselines or p.label not in wrong}
    eager = by_label["eager"]

    def ratio_to(baseline: str, plan: Plan, cpu: bool = False) -> float | None:
        other = by_label.get(baseline)
        if other is None or (plan.label in wrong and not args.trust_wrong_baselines):
            return None
        if cpu:
            return statistics.median(p / o for p, o in zip(plan.cpu_ms, other.cpu_ms))
        return statistics.median(p.median_ms / o.median_ms for p, o in zip(plan.runs, other.runs))

    bandwidth = copy_bandwidth(device)
    roofline_ms = bytes_per_step(model, session) / bandwidth * 1e3
    rows = []
    for plan in plans:
        row: dict[str, Any] = {"plan": plan.label}
        if plan.step is None:
            row["error"] = plan.error
            rows.append(row)
            continue
        median = statistics.median(run.median_ms for run in plan.runs)
        row.update({
            "median_ms": median, "p90_ms": statistics.median(run.p90_ms for run in plan.runs),
            "cpu_ms": statistics.median(plan.cpu_ms),
            "compile_s": plan.first.compile_seconds if plan is not eager else 0.0,
            "roofline_fraction": roofline_ms / median,
            "max_abs_diff_vs_eager": float((plan.first.logits - eager.first.logits).abs().max()),
            "correct_every_round": not plan.check.wrong, "check": plan.check.to_dict(),
            "check_summary": plan.check.summary(),
        })
        for baseline in BASELINES:
            value = ratio_to(baseline, plan)
            if value is not None:
                row[f"time_vs_{baseline.replace('torch.compile', 'torch_compile').replace(' ', '_')}"] = value
                row[f"cpu_vs_{baseline.replace('torch.compile', 'torch_compile').replace(' ', '_')}"] = \
                    ratio_to(baseline, plan, cpu=True)
        if plan.bit_exact is not None:
            row["bit_exact_vs_reference"] = plan.bit_exact
        if plan.realizations:
            row["realizations"] = plan.realizations
        if plan.backend is not None:  # which checks a call runs, and what one check costs (measured here)
            path, cost = guard_path_of(plan.step, session)
            row["guard_path"] = "guards-skipped-diagnostic" if "guards-skipped" in plan.label else path
            row["guard_cost_us"] = cost
        rows.append(row)

    hardware = describe_hardware(device)
    result = {"model": args.model, "device": str(device), "hardware": hardware, "torch": torch.__version__,
              "python": sys.version.split()[0], "threads": threads, "steps": args.steps, "warmup": args.warmup,
              "rounds": args.rounds, "copy_bandwidth_GBps": bandwidth / 1e9, "roofline_ms": roofline_ms, "rows": rows}
    present = [b for b in BASELINES if b in by_label]
    keys = [f"time_vs_{b.replace('torch.compile', 'torch_compile').replace(' ', '_')}" for b in present]
    lines = [f"# Decode-step latency: {args.model} on {hardware}", "",
             f"torch {torch.__version__}; {args.steps} timed steps after {args.warmup} warm-up; {args.rounds} interleaved "
             "rounds (every plan once per round, rotating order). Times are medians over rounds of each run's median step; "
             "\"time vs X\" is the median over rounds of (plan time / X time) in the same round: below 1.00 is faster. "
             "\"CPU ms\" and \"CPU vs\" use this thread's CPU time per step instead of the wall clock: on a shared machine "
             "they are not stretched by other processes taking the core (cache and memory contention remain). "
             f"Roofline {roofline_ms:.3f} ms at {bandwidth / 1e9:.1f} GB/s measured copy bandwidth. "
             "Every round runs each plan on a fresh StaticCache and checks its logits against eager's of that round "
             "(\"correct every round\"); a plan wrong on any round gets no ratios and is no baseline"
             + (" (--trust-wrong-baselines: kept, flagged)" if args.trust_wrong_baselines else "") + ".", "",
             "| plan | median ms | p90 ms | " + " | ".join(f"time vs {b}" for b in present) +
             " | CPU ms | CPU vs eager | CPU vs torch.compile | bit-exact vs reference | correct every round | max abs diff vs eager "
             "| compile s | realization |",
             "|---|---|---|" + "---|" * len(present) + "---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['plan']} | failed: {r['error']} |" + " |" * (len(present) + 10))
            continue
        exact = {True: "yes", False: "NO"}.get(r.get("bit_exact_vs_reference"), "-")
        ratios = " | ".join(f"{r[k]:.2f}x" if k in r else "-" for k in keys)
        cpu = " | ".join(f"{r[k]:.2f}x" if r.get(k) is not None else "-" for k in ("cpu_vs_eager", "cpu_vs_torch_compile"))
        cpu = f"{r['cpu_ms']:.3f} | {cpu}"
        lines.append(f"| {r['plan']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | {ratios} | {cpu} | {exact} | "
                     f"{r['check_summary']} | "
                     f"{r['max_abs_diff_vs_eager']:.2e} | {r['compile_s']:.1f} | {', '.join(r.get('realizations', [])) or '-'} |")
    guarded = [r for r in rows if "guard_path" in r]
    if guarded:
        lines += ["", "Guard path per superkernel plan, and the measured cost of one check (µs, this run): "
                  "full-guards = Dynamo's guard tree; precompiled = a state watch, torch's frame guards only when "
                  "something changed (superkernel.precompile_step)."]
        lines += [f"- {r['plan']}: {r['guard_path']}" + "".join(f", {k} {v:.1f} µs" for k, v in
                                                            r.get("guard_cost_us", {}).items()) for r in guarded]
    if any(r.get("roofline_fraction", 0) > 1 for r in rows):
        lines += ["", "A roofline fraction above 100 % (JSON) means the weights and cache stay in the CPU caches, "
                  "which are faster than the DRAM copy bandwidth the roofline uses."]
    if wrong:
        lines += ["", f"WRONG on some round (output differs from eager beyond the tolerance; not used as a baseline"
                  f"{' unless trusted' if args.trust_wrong_baselines else ''}): {', '.join(sorted(wrong))}."]
    args.output.mkdir(parents=True, exist_ok=True)
    stem = f"decode_latency_{Path(args.model).name if looks_like_path(args.model) else args.model}_{device.type}"
    atomic_write(args.output / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    atomic_write(args.output / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [r["plan"] for r in rows if r.get("bit_exact_vs_reference") is False]
    if failed:
        print(f"reduce-overhead not bit-exact: {', '.join(failed)}", file=sys.stderr)
    ours_wrong = sorted(label for label in wrong if label.startswith("superkernel"))
    if ours_wrong:
        print(f"superkernel plans wrong on some round: {', '.join(ours_wrong)}", file=sys.stderr)
    return 1 if failed or ours_wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
