"""graph-autofusion benchmark: Llama-style and BERT-style blocks through the CLI with --benchmark.

    .venv/bin/python benchmarks/onnx_autofusion.py [--repeat N] [--quick]

For each model: export from PyTorch, run ``graph-autofusion --opt-level 3 --benchmark``,
and record ONNX Runtime CPU latency (median of repeated, interleaved runs, all measured in
the same process run) of the original with ORT_DISABLE_ALL, the original with
ORT_ENABLE_ALL and the fused model with ORT_ENABLE_ALL. Writes
benchmarks/results/onnx_autofusion.json and .md and prints the ratios.

Target (issue 5): fused >= original with ORT_ENABLE_ALL everywhere, and faster where ORT's
own optimizer misses a fusion on CPU (rotary embedding, grouped-query attention).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import onnxruntime as ort

from superkernel.tools.advisor.environment import cpu_name
from superkernel.onnx import zoo
from superkernel.onnx.cli import main as gaf

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

CASES = [
    # name, zoo model, dims
    ("llama-prefill-s128", "llama", zoo.Dims(batch=1, seq=128, hidden=512, heads=8, kv_heads=2, intermediate=1408)),
    ("llama-short-s16", "llama", zoo.Dims(batch=1, seq=16, hidden=512, heads=8, kv_heads=2, intermediate=1408)),
    ("bert-s128", "bert", zoo.Dims(batch=1, seq=128, hidden=384, heads=6, kv_heads=6, intermediate=1536)),
    ("ln_mlp-s128", "ln_mlp", zoo.Dims(batch=1, seq=128, hidden=512, heads=8, kv_heads=8, intermediate=2048)),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="fewer runs (smoke test)")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    repeat, warmup = (20, 3) if a.quick else (a.repeat, a.warmup)
    os.makedirs(a.out, exist_ok=True)
    hw = {"cpu": cpu_name(), "cores": os.cpu_count(), "onnxruntime": ort.__version__, "python": sys.version.split()[0]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, dims in CASES:
            src = zoo.export(model, os.path.join(tmp, f"{name}.onnx"), dims)
            rep = os.path.join(tmp, f"{name}.md")
            t0 = time.perf_counter()
            code = gaf(["--input", src, "--output", os.path.join(tmp, f"{name}_fused.onnx"), "--opt-level", "3",
                        "--benchmark", "--bench-repeat", str(repeat), "--bench-warmup", str(warmup),
                        "--report", rep, "--quiet"])
            wall = time.perf_counter() - t0
            data = json.load(open(os.path.join(tmp, f"{name}.json")))
            if code != 0:
                print(f"{name}: graph-autofusion exit code {code}: {data.get('message')}")
                rows.append({"case": name, "exit_code": code})
                continue
            b = data["benchmark"]
            t = {(x["model"], x["level"]): x["median_ms"] for x in b["timings"]}
            row = {
                "case": name, "model": model, "dims": dims.__dict__, "exit_code": code,
                "nodes_before": data["nodes_before"], "nodes_after": data["nodes_after"],
                "fusions": sorted({c["rule"] for c in data["applied"]}),
                "original_disable_all_ms": t[("original", "ORT_DISABLE_ALL")],
                "original_enable_all_ms": t[("original", "ORT_ENABLE_ALL")],
                "fused_enable_all_ms": t[("fused", "ORT_ENABLE_ALL")],
                "speedup_vs_ort_enable_all": b["speedup_vs_ort_enable_all"],
                "speedup_vs_ort_disable_all": b["speedup_vs_ort_disable_all"],
                "max_abs_diff": max(o["max_abs_diff"] for o in data["verification"]["outputs"]),
                "tool_seconds": wall,
            }
            rows.append(row)
            print(f"{name:<20} nodes {row['nodes_before']:>3} -> {row['nodes_after']:<3} "
                  f"orig DISABLE_ALL {row['original_disable_all_ms']:.3f} ms | orig ENABLE_ALL "
                  f"{row['original_enable_all_ms']:.3f} ms | fused ENABLE_ALL {row['fused_enable_all_ms']:.3f} ms | "
                  f"speedup vs ENABLE_ALL {row['speedup_vs_ort_enable_all']:.3f}x")
    result = {"benchmark": "onnx_autofusion", "hardware": hw, "repeat": repeat, "warmup": warmup, "cases": rows}
    with open(os.path.join(a.out, "onnx_autofusion.json"), "w") as f:
        json.dump(result, f, indent=2)
    md = [f"# graph-autofusion benchmark (ONNX Runtime CPU)", "",
          f"Hardware: {hw['cpu']}, {hw['cores']} cores; onnxruntime {hw['onnxruntime']}; "
          f"median of {repeat} interleaved runs after {warmup} warm-up runs, all in one process run.", "",
          "| case | nodes | fusions | orig DISABLE_ALL ms | orig ENABLE_ALL ms | fused ENABLE_ALL ms | "
          "speedup vs ENABLE_ALL | speedup vs DISABLE_ALL |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("exit_code"):
            md.append(f"| {r['case']} | failed (exit {r['exit_code']}) | | | | | | |")
            continue
        md.append(f"| {r['case']} | {r['nodes_before']} -> {r['nodes_after']} | {', '.join(r['fusions'])} | "
                  f"{r['original_disable_all_ms']:.3f} | {r['original_enable_all_ms']:.3f} | "
                  f"{r['fused_enable_all_ms']:.3f} | {r['speedup_vs_ort_enable_all']:.3f}x | "
                  f"{r['speedup_vs_ort_disable_all']:.3f}x |")
    with open(os.path.join(a.out, "onnx_autofusion.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"results: {os.path.join(a.out, 'onnx_autofusion.json')} and .md")
    return 0 if all(r.get("exit_code") == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
