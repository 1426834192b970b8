"""The autofusion planner on CPU max-autotune: decode-step latency with vs without it, interleaved.

    python benchmarks/autofusion_torch.py [--models llama-tiny,llama,mistral,qwen3_moe,mixtral,gpt_neox,falcon]
                                          [--steps 16] [--warmup 3] [--rounds 5] [--threads 1]
                                          [--real-width-layers 0] [--control]

Per model (a zoo name such as ``llama-tiny``, or a sweep architecture of
``superkernel.tools.models.archs``: 2 layers, hidden 64): one scope per decoder layer, superkernel
``max-autotune`` with ``inductor.autofusion`` off and on (everything else default: freezing by
measurement, Inductor's GEMM templates), each compiled once (compile time = its first step, beside
latency), then timed in rotating rounds with eager, each run on a fresh StaticCache and checked
against eager's logits on that round (``superkernel.tools.peer_check``: the precision check).
Reported: median step time, the per-round ratio on/off (median over rounds), the geometric mean of
the ratios, and how many candidates the planner applied / rejected. ``--real-width-layers N`` adds
a Qwen2-0.5B-shaped model (hidden 896, intermediate 4864) with N layers, batch 1.
Writes benchmarks/results/autofusion_torch.{json,md}. Prints the load: the box may be shared.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import superkernel as sk  # noqa: E402
from decode_latency import Plan, own_code, step_for, time_rounds  # noqa: E402
from superkernel.tools.advisor.environment import hardware  # noqa: E402
from superkernel.tools.advisor.strategies import plan_for  # noqa: E402
from superkernel.tools.advisor.structure import analyze_structure  # noqa: E402
from superkernel.tools.decode import prepare, run_decode  # noqa: E402
from superkernel.tools.peer_check import peer_tolerance  # noqa: E402
from superkernel.util import atomic_write  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MODELS = "llama-tiny,llama,mistral,qwen3_moe,mixtral,gpt_neox,falcon"
CONTROL = "max-autotune off again"


def load(name: str, real_width_layers: int) -> torch.nn.Module:
    from superkernel.tools.models import load_model
    from superkernel.tools.models.archs import ARCHS, build
    from superkernel.tools.models.zoo import ZOO

    if name == "qwen2-0.5b-shaped":
        from real_width import build_model

        return build_model(real_width_layers, torch.float32)
    if name in ZOO:
        return load_model(name).model
    if name in ARCHS:
        return build(name).eval().requires_grad_(False)
    raise SystemExit(f"unknown model {name!r}: a zoo name or one of {', '.join(ARCHS)}")


def planner_plan(label: str, autofusion: bool, freezing: Any) -> Plan:
    def make(fn: Any) -> Any:
        cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune",
                                           "inductor": {"autofusion": autofusion, "freezing": freezing}})
        plan.backend = sk.get_backend(cfg)
        return torch.compile(fn, backend=plan.backend, dynamic=False)

    plan = Plan(label, make, {"_": []}, "max-autotune")
    return plan


def decisions(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for seg in sk.explain(plan.backend).segments:
        for d in seg.autofusion:
            if d["rule"] == "variant":
                key = f"kept {d['where'].split()[0]}"
            else:
                key = f"{d['rule']} {d['status']}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def explain_lines(plan: Plan) -> list[str]:
    """explain()'s planner lines of the planned variant, per segment (the decisions with predicted and measured benefit)."""
    from superkernel.ir.decision import describe

    return [f"{seg.name}: {describe(d)}" for seg in sk.explain(plan.backend).segments for d in seg.autofusion]


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = load(name, args.real_width_layers)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup)
    scopes = plan_for("decoder_layer", analyze_structure(model)).scopes
    scoped = copy.deepcopy(model)
    sk.apply_scopes(scoped, scopes)
    freezing = {"auto": "auto", "true": True}[args.freezing]
    plans = [Plan("eager", lambda fn: fn), planner_plan("max-autotune off", False, freezing),
             planner_plan("max-autotune on", True, freezing)]
    if args.control:  # A/A: the unplanned segment compiled a second time, timed like the others
        plans.append(planner_plan(CONTROL, False, freezing))
    for i, plan in enumerate(plans):
        base = step_for(session, model if plan.label == "eager" else scoped, plan)
        plan.step = plan.make(own_code(base, f"{name.replace('-', '_').replace('.', '_')}{i}"))
        session.restore_cache()
        plan.first = run_decode(session, plan.step, label=plan.label)
        print(f"{name}: compiled {plan.label} in {plan.first.compile_seconds:.1f} s", flush=True)
    dtype = next(model.parameters()).dtype
    time_rounds(session, plans, args.rounds, {}, peer_tolerance(dtype), lambda line: print(f"{name}: {line}", flush=True))
    off, on = plans[1], plans[2]
    ratios = [b.median_ms / a.median_ms for a, b in zip(off.runs, on.runs)]
    cpu_ratios = [b / a for a, b in zip(off.cpu_ms, on.cpu_ms)]
    row = {"model": name, "ratio_on_off": statistics.median(ratios), "ratios": ratios,
           "cpu_ratio_on_off": statistics.median(cpu_ratios), "cpu_ratios": cpu_ratios,
           "decisions": decisions(on), "explain": explain_lines(on), "load_after": os.getloadavg()}
    if args.control:
        again = plans[3]
        row["control_ratio"] = statistics.median(b.median_ms / a.median_ms for a, b in zip(off.runs, again.runs))
        row["control_cpu_ratio"] = statistics.median(b / a for a, b in zip(off.cpu_ms, again.cpu_ms))
    for p in plans:
        row[p.label] = {"median_ms": statistics.median(r.median_ms for r in p.runs),
                        "cpu_ms": statistics.median(p.cpu_ms),
                        "compile_s": p.first.compile_seconds if p.first else None,
                        "correct": not p.check.wrong, "check": p.check.summary() if hasattr(p.check, "summary") else None}
    return row


def geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(math.log(x) for x in values) / len(values)), 4) if values else None


def markdown(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    lines = [f"# Autofusion planner (torch): CPU max-autotune with vs without, {header['hardware']}", "",
             f"torch {torch.__version__}, transformers {header.get('transformers')}; batch 1, prompt {header['prompt_len']}, {header['steps']} timed steps after "
             f"{header['warmup']} warm-up, {header['rounds']} rotating rounds (eager, off, on{', off again' if header.get('control_geomean') else ''}), each run on a fresh "
             "StaticCache checked against eager's logits of that round. ratio = on/off per round, median over rounds; "
             "cpu ratio: the same with this thread's CPU time per step (time.thread_time, 1 torch thread), which "
             "other processes on a shared box stretch far less than wall time.",
             f"inductor.freezing: {header['freezing']} (both variants).",
             f"Load when it started: {header['load_start']}; when it ended: {header['load_end']}.", "",
             "| model | off ms | on ms | ratio on/off | cpu ratio on/off | off compile s | on compile s | correct (off/on) "
             "| A/A off again/off (wall, cpu) | planner decisions |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | - | failed: {r['error']} |")
            continue
        off, on = r["max-autotune off"], r["max-autotune on"]
        dec = ", ".join(f"{k} {v}" for k, v in sorted(r["decisions"].items()))
        aa = f"{r['control_ratio']:.3f}, {r['control_cpu_ratio']:.3f}" if "control_ratio" in r else "-"
        lines.append(f"| {r['model']} | {off['median_ms']:.3f} | {on['median_ms']:.3f} | {r['ratio_on_off']:.3f} | "
                     f"{r['cpu_ratio_on_off']:.3f} | "
                     f"{off['compile_s']:.1f} | {on['compile_s']:.1f} | {off['correct']}/{on['correct']} | {aa} | {dec} |")
    lines += ["", f"Geometric mean of ratio on/off: {header['geomean']} (wall), {header['cpu_geomean']} (CPU time)."]
    if header.get("control_geomean") is not None:
        lines.append(f"A/A control (the unplanned variant compiled again, timed in the same rounds): geometric mean of "
                     f"off again/off {header['control_geomean']} (wall), {header['control_cpu_geomean']} (CPU time): "
                     "the noise floor of the ratios above.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--freezing", choices=("auto", "true"), default="auto",
                        help="inductor.freezing of both variants (true: no plain-vs-frozen timing, so the only "
                             "difference between them is the planner)")
    parser.add_argument("--output-name", default="autofusion_torch", help="stem of the result files: a configuration's name, never a run's: its next run overwrites the file, git keeps the history")
    parser.add_argument("--control", action="store_true",
                        help="also compile the unplanned variant a second time and time it in the same rounds (A/A: "
                             "the noise floor of the on/off ratio)")
    parser.add_argument("--real-width-layers", type=int, default=0,
                        help="add a Qwen2-0.5B-shaped model with this many layers (0: none)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    if args.real_width_layers:
        models.append("qwen2-0.5b-shaped")
    import transformers

    header = {"hardware": hardware(torch.device("cpu")), "transformers": transformers.__version__,
              "load_start": os.getloadavg(), "steps": args.steps,
              "warmup": args.warmup, "rounds": args.rounds, "prompt_len": args.prompt_len, "freezing": args.freezing}
    print(f"{header['hardware']}; load {header['load_start']}", flush=True)
    rows = []
    for name in models:
        try:
            rows.append(run_model(name, args))
        except Exception as exc:  # noqa: BLE001 - one failing model is reported, not fatal
            rows.append({"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"})
        print(json.dumps(rows[-1], default=str)[:400], flush=True)
        header["geomean"] = geomean([r["ratio_on_off"] for r in rows if "ratio_on_off" in r])
        header["cpu_geomean"] = geomean([r["cpu_ratio_on_off"] for r in rows if "cpu_ratio_on_off" in r])
        header["control_geomean"] = geomean([r["control_ratio"] for r in rows if "control_ratio" in r])
        header["control_cpu_geomean"] = geomean([r["control_cpu_ratio"] for r in rows if "control_cpu_ratio" in r])
        header["load_end"] = os.getloadavg()
        args.output.mkdir(parents=True, exist_ok=True)
        atomic_write(args.output / f"{args.output_name}.json", json.dumps({**header, "rows": rows}, indent=1, default=str))
        atomic_write(args.output / f"{args.output_name}.md", markdown(rows, header))
    print(markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
