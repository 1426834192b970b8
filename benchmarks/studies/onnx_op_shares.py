"""Where ONNX Runtime spends a real-width model's time, per operator type: the room fusion has.

    .venv/bin/python benchmarks/studies/onnx_op_shares.py [--cases bert_base,clip_text] [--exporters legacy,dynamo] [--runs 8]

Per case of ``superkernel.onnx.realsuite`` (the exports ``onnx_real_width.py`` caches in
``--models``; made here when missing): the original under ORT_ENABLE_ALL (P1, the baseline of
issue 25's criteria), 1 intra-op thread, ``--runs`` runs after 3 warm-up runs under ORT's own
profiler, kernel time summed per operator type. Reported: the share of GEMM-like kernels
(MatMul, Gemm, FusedMatMul), of attention kernels, and of everything else.

Why: graph-autofusion rewrites the graph with ONNX Runtime's own (contrib) operators, so it does
not make P1's GEMM kernels faster; what it can remove is the rest (element-wise, norms, layout
ops, per-node overhead) and part of the attention MatMuls (fused attention). ``1 - rest share``
is therefore about the best GA/P1 a case allows when every non-GEMM kernel disappeared, an
optimistic bound rather than a target. Writes benchmarks/results/onnx_op_shares.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
sys.path[:0] = [HERE, BENCH]

from onnx_real_width import EXPORTERS, model_path, selection  # noqa: E402

from superkernel.onnx import realsuite  # noqa: E402
from superkernel.util import write_results  # noqa: E402

RESULTS = os.path.join(BENCH, "results")
GEMM = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm"}
ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "Softmax"}


def kernel_times(path: str, runs: int) -> dict[str, float]:
    """Microseconds of kernel time per operator type over ``runs`` profiled runs of P1."""
    import onnxruntime as ort

    from superkernel.onnx import verify

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory(prefix="sk_op_shares_") as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "p1")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feeds = verify.make_inputs(sess, {}, verify.VERIFY_DEFAULT_DIM, 0)
        for _ in range(3):
            sess.run(None, feeds)
        for _ in range(runs):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per_op: collections.Counter[str] = collections.Counter()
    # the profile holds the warm-up runs too: keep the last `runs` runs' node events
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = model_runs[-runs]["ts"] if len(model_runs) >= runs else 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            per_op[e["args"]["op_name"]] += e["dur"]
    return dict(per_op)


def shares(per_op: dict[str, float]) -> dict:
    total = sum(per_op.values())
    gemm = sum(v for k, v in per_op.items() if k in GEMM)
    attention = sum(v for k, v in per_op.items() if k in ATTENTION)
    rest = total - gemm - attention
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:8]
    return {"gemm": gemm / total, "attention": attention / total, "rest": rest / total,
            "best_ga_p1_if_rest_removed": 1 - rest / total,
            "top": [[k, v / total] for k, v in top]}


def markdown(result: dict) -> str:
    lines = ["# Where ONNX Runtime (P1, ORT_ENABLE_ALL, 1 thread) spends real-width time, per operator type", "",
             f"{result['hardware']}; onnxruntime {result['onnxruntime']}; {result['runs']} profiled runs per case after "
             f"3 warm-up runs; kernel time from ORT's profiler (per-node framework overhead is not in it). "
             f"Load (1 min) at start / end: {result['load'][0]:.2f} / {result['load'][1]:.2f}. Shares are of kernel "
             "time, so the box's load changes them little.", "",
             "GA rewrites graphs with ORT's own operators: it cannot make P1's GEMM kernels faster. "
             "\"1 - rest\" is the GA/P1 a case would reach if every non-GEMM, non-attention kernel vanished: "
             "an optimistic bound, not a target.", "",
             "| case | GEMM share | attention share | rest | 1 - rest | top operator types |",
             "|---|---:|---:|---:|---:|---|"]
    for r in result["cases"]:
        top = ", ".join(f"{k} {v:.1%}" for k, v in r["top"])
        lines.append(f"| {r['case']} | {r['gemm']:.1%} | {r['attention']:.1%} | {r['rest']:.1%} | "
                     f"{r['best_ga_p1_if_rest_removed']:.3f} | {top} |")
    g = result.get("geomean_bound")
    if g is not None:
        lines += ["", f"Geometric mean of \"1 - rest\" over these cases: {g:.3f} (issue 25 asks GA/P1 <= 0.97)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(realsuite.CASES))
    p.add_argument("--exporters", default=",".join(EXPORTERS))
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"))
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    import onnxruntime as ort
    import torch

    from superkernel.tools.advisor.environment import hardware

    cases, exporters = selection(args.cases, args.exporters)
    os.makedirs(args.out, exist_ok=True)
    load_start = os.getloadavg()[0]
    rows = []
    for case in cases:
        for exporter in exporters:
            row = {"case": f"{case}/{exporter}", **shares(kernel_times(model_path(args.models, case, exporter), args.runs))}
            rows.append(row)
            print(f"{row['case']}: GEMM {row['gemm']:.1%}, attention {row['attention']:.1%}, rest {row['rest']:.1%}",
                  flush=True)
    bounds = [r["best_ga_p1_if_rest_removed"] for r in rows]
    result = {"hardware": hardware(torch.device("cpu")).split(", torch threads")[0] + ")", "onnxruntime": ort.__version__, "runs": args.runs,
              "load": [load_start, os.getloadavg()[0]], "cases": rows,
              "geomean_bound": math.exp(sum(map(math.log, bounds)) / len(bounds)) if bounds else None}
    write_results(args.out, "onnx_op_shares", result, markdown(result), indent=2)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
