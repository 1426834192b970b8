"""Does one plan read the same whichever way it is compiled and wherever it is timed? (issue 21, run 6)

    .venv/bin/python benchmarks/studies/retime_paths.py [--arch gpt_neox] [--rounds 7]

One process, 1 thread, the tiny architecture written as a checkpoint. Each variant on its own
model copy and decode session, compiled once, then all timed interleaved (order rotating each
round; median step of 16 after 3 warm-up per round, median over rounds):

- plain torch.compile (the auto search's baseline);
- decoder_layer / reduce-overhead and all_layers / reduce-overhead as ``optimize`` compiles them
  (``compile_superkernel(keep=True)``: a precompiled frame, own code object);
- decoder_layer / reduce-overhead as runs 4-5 of benchmarks/auto_strategy.py re-timed it
  (``torch.compile(session.step_fn(), backend=superkernel)``, Dynamo's guard tree every call), the
  first on the shared step code object, then all_layers on the same code object (a second cache
  entry: hypothesis (a)), then on its own code object.

Results: ``benchmarks/results/retime_paths.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent  # benchmarks/: results/ and the scripts this study builds on
sys.path.insert(0, str(BENCH.parent / "src"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt_neox")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--output", type=Path, default=BENCH / "results")
    args = parser.parse_args(argv)
    import torch

    import superkernel
    from superkernel.tools.advisor.compiling import (compile_inductor, compile_superkernel, guard_path_of, own_code,
                                                     superkernel_backend)
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.timing import rotation
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models import load_model
    from superkernel.tools.models.archs import save_checkpoint
    from superkernel.util import atomic_write

    torch.set_num_threads(1)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sk_retime_") as tmp:
        base = load_model(str(save_checkpoint(args.arch, Path(tmp) / args.arch))).model
    structure = analyze_structure(base)

    def session(strategy: str | None):
        model = copy.deepcopy(base)
        if strategy:
            superkernel.apply_scopes(model, plan_for(strategy, structure).scopes)
        return prepare(model, prompt_len=32, steps=16, warmup=3, seed=0)

    def bench_way(s, own: bool):
        fn = own_code(s.step_fn()) if own else s.step_fn()
        return torch.compile(fn, backend=superkernel_backend("reduce-overhead"), dynamic=False)

    variants = {}
    s = session(None)
    variants["plain torch.compile"] = (s, compile_inductor(s, keep=True))
    s = session("decoder_layer")
    variants["decoder_layer / reduce-overhead, as optimize compiles it"] = (s, compile_superkernel(s, "reduce-overhead", keep=True)[0])
    s = session("decoder_layer")
    variants["decoder_layer / reduce-overhead, runs 4-5 re-time (shared code, 1st)"] = (s, bench_way(s, False))
    s = session("all_layers")
    variants["all_layers / reduce-overhead, runs 4-5 re-time (shared code, 2nd)"] = (s, bench_way(s, False))
    s = session("decoder_layer")
    variants["decoder_layer / reduce-overhead, runs 4-5 re-time (own code)"] = (s, bench_way(s, True))
    s = session("all_layers")
    variants["all_layers / reduce-overhead, as optimize compiles it"] = (s, compile_superkernel(s, "reduce-overhead", keep=True)[0])
    rows = {}
    for name, (s, step) in variants.items():
        first = run_decode(s, step)
        path, cost = guard_path_of(step, s)
        rows[name] = {"compile_s": first.compile_seconds + getattr(step, "build_seconds", 0.0), "guard_path": path,
                      "guard_cost_us": cost, "recompiles_first": first.dynamo.recompiles_first, "rounds_ms": []}
    names = list(variants)
    for r in range(args.rounds):
        for name in (names[i] for i in rotation(len(names), r)):
            rows[name]["rounds_ms"].append(run_decode(*variants[name]).median_ms)
    for row in rows.values():
        row["median_ms"] = statistics.median(row["rounds_ms"])
    meta = {"arch": args.arch, "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
            "threads": 1, "torch": torch.__version__, "load_average_start": load_start, "load_average_end": os.getloadavg(),
            "rounds": args.rounds}
    args.output.mkdir(parents=True, exist_ok=True)
    atomic_write(args.output / "retime_paths.json", json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# One plan, compiled and timed different ways ({args.arch}, tiny)", "",
             f"{meta['hardware']} (shared machine), 1 thread, torch {torch.__version__}; load average (1 min) "
             f"{load_start[0]:.1f} at the start, {meta['load_average_end'][0]:.1f} at the end; every variant in one "
             f"process, timed interleaved over {args.rounds} rounds (median of 16 steps per round).", "",
             "| variant | median ms | rounds ms | guard path | guard cost µs | recompiles (1st step) | compile s |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        cost = ", ".join(f"{k} {v:.0f}" for k, v in row["guard_cost_us"].items())
        lines.append(f"| {name} | {row['median_ms']:.3f} | {' '.join(f'{x:.3f}' for x in row['rounds_ms'])} | "
                     f"{row['guard_path']} | {cost} | {row['recompiles_first']} | {row['compile_s']:.2f} |")
    atomic_write(args.output / "retime_paths.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
