"""Tensor parallelism on CPU: ``superkernel optimize --nproc N`` against one process on the same cores.

    python benchmarks/tp_cpu.py [--models llama-tiny,qwen3-moe-tiny] [--nproc 2] [--steps 16] [--quick]

For each model, one ``optimize --nproc N`` run (gloo) with one strategy in reduce-overhead:
the job's step time (slowest rank per step, median), each rank's, compile time, the
collectives' share of the step (torch.profiler), and the single-process run of the same
plans on the same cores (N x the per-rank threads) from the same command. The machine's
load average before and after is recorded: the single-process and the tensor-parallel
runs are measured one after the other, not interleaved, so a load change between them
shows in the ratio. Writes ``benchmarks/results/tp_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STRATEGY = {"llama-tiny": "decoder_layer", "qwen3-moe-tiny": "decoder_layer", "deepseek-v3-tiny": "decoder_layer"}


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def run_model(model: str, nproc: int, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tp_cpu_") as tmp:
        argv = [sys.executable, "-m", "superkernel", "optimize", "--model", model, "--nproc", str(nproc),
                "--strategy", STRATEGY.get(model, "decoder_layer"), "--mode", "reduce-overhead", "--steps", str(steps),
                "--warmup", str(warmup), "--output", tmp, "--quiet"]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        before, start = _load(), time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            return {"model": model, "exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}
        data = json.loads((Path(tmp) / "results.json").read_text())
    single = {r["name"]: r for r in data["single_process"]["runs"]}
    rows = []
    for row in data["results"]:
        if row.get("error"):
            rows.append({"name": row["name"], "error": row["error"]})
            continue
        shares = [s.get(row["name"], {}).get("share") for s in data["collective_share"]]
        rows.append({"name": row["name"], "job_ms": row["job_ms"], "rank_ms": row["rank_ms"],
                     "compile_s": row["compile_s"], "passed_every_rank": row["passed_every_rank"],
                     "single_ms": single.get(row["name"], {}).get("median_ms"),
                     "single_compile_s": single.get(row["name"], {}).get("compile_s"),
                     "tp_vs_single": (row["job_ms"] / single[row["name"]]["median_ms"]
                                      if single.get(row["name"], {}).get("median_ms") else None),
                     "collective_share": shares})
    return {"model": model, "exit": 0, "nproc": nproc, "threads_per_rank": data["single_process"]["threads_per_rank"],
            "single_threads": data["single_process"]["threads"], "hardware": data["hardware"],
            "load_before": before, "load_after": _load(), "wall_s": round(wall, 1), "recommended": data["recommended"],
            "rows": rows}


def markdown(results: list[dict], args) -> str:
    lines = ["# Tensor parallelism on CPU: 2 gloo ranks vs one process on the same cores", "",
             f"`python benchmarks/tp_cpu.py --nproc {args.nproc} --steps {args.steps}`; {platform.node()}; "
             "job ms/step = median over timed steps of the slowest rank; single = the same run unsharded in one "
             "process with N x the per-rank threads; TP/single < 1 means tensor parallelism was faster.", ""]
    for res in results:
        if res.get("exit"):
            lines += [f"## {res['model']}: failed (exit {res['exit']}): {res.get('error')}", ""]
            continue
        lines += [f"## {res['model']} ({res['hardware']})", "",
                  f"{res['nproc']} ranks x {res['threads_per_rank']} thread(s) vs 1 process x {res['single_threads']} "
                  f"threads; load average before {res['load_before']}, after {res['load_after']}; "
                  f"whole command {res['wall_s']} s", "",
                  "| run | TP job ms/step | rank ms | single-process ms/step | TP / single | collectives' share "
                  "(per rank) | TP compile s | single compile s | precision on every rank |",
                  "|---|---:|---|---:|---:|---|---:|---:|---|"]
        for row in res["rows"]:
            if "error" in row:
                lines.append(f"| {row['name']} | error: {row['error'][:120]} | | | | | | | |")
                continue
            ratio = f"{row['tp_vs_single']:.2f}" if row["tp_vs_single"] else "—"
            share = ", ".join(f"{s:.0%}" if s is not None else "—" for s in row["collective_share"])
            single = f"{row['single_ms']:.3f}" if row["single_ms"] else "—"
            sc = f"{row['single_compile_s']:.1f}" if row["single_compile_s"] is not None else "—"
            lines.append(f"| {row['name']} | {row['job_ms']:.3f} | {', '.join(f'{v:.3f}' for v in row['rank_ms'])} | "
                         f"{single} | {ratio} | {share} | {row['compile_s']:.1f} | {sc} | "
                         f"{'passed' if row['passed_every_rank'] else 'FAILED'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama-tiny,qwen3-moe-tiny")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 steps, llama-tiny only")
    parser.add_argument("--output", type=Path, default=RESULTS, help="folder for tp_cpu.json and .md")
    args = parser.parse_args()
    if args.quick:
        args.models, args.steps = "llama-tiny", 4
    results = [run_model(m, args.nproc, args.steps, args.warmup) for m in args.models.split(",")]
    args.output.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "src"))
    from superkernel.util import atomic_write

    atomic_write(args.output / "tp_cpu.json", json.dumps(results, indent=2) + "\n")
    text = markdown(results, args)
    atomic_write(args.output / "tp_cpu.md", text)
    print(text)
    return 0 if all(r.get("exit") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
