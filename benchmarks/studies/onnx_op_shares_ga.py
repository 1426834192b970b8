"""Where graph-autofusion's fused real-width models still spend time, per operator type, beside P1.

    .venv/bin/python benchmarks/studies/onnx_op_shares_ga.py [--cases bert_base,clip_text] [--exporters legacy,dynamo] [--runs 10]

Per case of ``superkernel.onnx.realsuite`` (exports cached in ``--models`` as by
``onnx_real_width.py``): graph-autofusion fuses the export as a user would run it (calibrated,
end-to-end checked, verified, 1 thread; the fused model is kept in ``--work`` and reused unless
``--refuse``), then P1 (the original under ORT_ENABLE_ALL) and GA's output (ORT_ENABLE_ALL) are
profiled with ORT's own profiler, both sessions at once, in ``--runs`` interleaved rounds (one
run of each), after a throw-away session warmed the process: on a shared machine the load moves
absolute kernel times by 2x between looks, a round's two runs see the same load. Kernel time is
summed per operator type.

Per case: GA's GEMM / attention / rest shares of its own kernel time, its kernel time against
P1's (median per-round ratio), and the optimistic bound "GA/P1 if all of GA's remaining
non-GEMM, non-attention kernel time vanished" = (GA kernel time - GA rest) / P1 kernel time
(median over rounds); the geometric mean of that bound; and which operator types make up GA's
rest (the targets). Kernel time leaves out ORT's per-node framework overhead, so measured
latency ratios differ a little from kernel-time ratios.
Writes benchmarks/results/<--name>.{json,md} (default onnx_op_shares_ga).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
sys.path[:0] = [HERE, BENCH]

from onnx_op_shares import ATTENTION, GEMM  # noqa: E402
from onnx_real_width import EXPORTERS, model_path, selection  # noqa: E402

from superkernel.onnx import realsuite  # noqa: E402
from superkernel.timing import rotation  # noqa: E402
from superkernel.util import write_results  # noqa: E402

RESULTS = os.path.join(BENCH, "results")


def fuse(src: str, folder: str, calibration_cache: str, refuse: bool) -> dict:
    """GA's output for ``src`` in ``folder`` (made now, or reused): path, kinds kept, seconds."""
    from superkernel.onnx.cli import main as gaf

    out, report = os.path.join(folder, "GA.onnx"), os.path.join(folder, "GA_report.md")
    info_path = os.path.join(folder, "GA_report.json")
    t0, made = time.perf_counter(), False
    if refuse or not (os.path.exists(out) and os.path.exists(info_path)):
        os.makedirs(folder, exist_ok=True)
        code = gaf(["--input", src, "--output", out, "--report", report, "--quiet", "--threads", "1",
                    "--calibration-cache", calibration_cache])
        if code != 0:
            raise RuntimeError(f"graph-autofusion exited {code} on {src} (report {report})")
        made = True
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    return {"path": out, "fused_now": made, "seconds": time.perf_counter() - t0 if made else None,
            "kept_rules": sorted({c["rule"] for c in info.get("applied", [])}),
            "not_kept": sorted({c["rule"] for c in info.get("skipped", []) if c["reason"].startswith("not faster")}),
            "end_to_end": {k: (info.get("end_to_end") or {}).get(k) for k in ("ratio", "verdict", "dropped_rules")}}


def per_run_kernel_us(profile_path: str) -> list[dict[str, float]]:
    """Kernel µs per operator type of every ``model_run`` in one session's ORT profile."""
    with open(profile_path, encoding="utf-8") as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    out: list[collections.Counter] = [collections.Counter() for _ in runs]
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            for i, (a, b) in enumerate(runs):
                if a <= e["ts"] <= b:
                    out[i][e["args"]["op_name"]] += e["dur"]
                    break
    return [dict(c) for c in out]


def profile_pair(p1: str, ga: str, rounds: int, seed: int) -> list[tuple[dict[str, float], dict[str, float]]]:
    """Per round, kernel µs per operator type of P1 and of GA: both sessions profiled at once, the
    process warmed by a throw-away session, created in a seeded random order, 3 warm-up runs each,
    then ``rounds`` interleaved rounds (one run of each, order alternating), so both runs of a round
    see the same load of the shared machine."""
    import onnxruntime as ort

    from superkernel.onnx import timing as T
    from superkernel.onnx import verify

    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory(prefix="sk_op_shares_ga_") as tmp:
        def make(path: str, tag: str):
            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            so.graph_optimization_level = level
            so.log_severity_level = 3
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, tag)
            return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

        warm = verify.session(p1, level, 1)
        feeds = verify.make_inputs(warm, {}, verify.VERIFY_DEFAULT_DIM, 0)
        for _ in range(3):
            warm.run(None, feeds)
        del warm
        sessions: dict[str, object] = {}
        for i in T.creation_order(2, seed):
            tag = ("P1", "GA")[i]
            sessions[tag] = make(p1 if tag == "P1" else ga, tag)
        for _ in range(3):
            for sess in sessions.values():
                sess.run(None, feeds)
        for r in range(rounds):
            for tag in (("P1", "GA")[i] for i in rotation(2, r)):
                sessions[tag].run(None, feeds)
        per = {tag: per_run_kernel_us(sess.end_profiling())[-rounds:] for tag, sess in sessions.items()}
    return list(zip(per["P1"], per["GA"]))


def split(per_op: dict[str, float]) -> tuple[float, float, float, float]:
    total = sum(per_op.values())
    gemm = sum(v for k, v in per_op.items() if k in GEMM)
    att = sum(v for k, v in per_op.items() if k in ATTENTION)
    return total, gemm, att, total - gemm - att


def _median(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Per operator type, the median over rounds (a type absent from a round counts 0 there):
    one preempted round of a shared machine does not move it."""
    import statistics

    keys = {k for d in dicts for k in d}
    return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in keys}


def case_row(case: str, pairs: list[tuple[dict[str, float], dict[str, float]]], fused: dict) -> dict:
    """Per-round paired figures (median over rounds) and per-type medians."""
    import statistics

    ratio, bound, p1_rest = [], [], []
    for p1, ga in pairs:
        t1, _, _, r1 = split(p1)
        t2, _, _, r2 = split(ga)
        ratio.append(t2 / t1)
        bound.append((t2 - r2) / t1)
        p1_rest.append(r1 / t1)
    p1, ga = _median([a for a, _ in pairs]), _median([b for _, b in pairs])
    p1_total, p1_gemm, p1_att, _ = split(p1)
    ga_total, ga_gemm, ga_att, ga_rest = split(ga)
    rest_types = sorted(((k, v) for k, v in ga.items() if k not in GEMM and k not in ATTENTION), key=lambda kv: -kv[1])
    types = sorted(set(p1) | set(ga), key=lambda k: -max(p1.get(k, 0), ga.get(k, 0)))
    return {"case": case, "rounds": len(pairs), "p1_kernel_us": p1_total, "ga_kernel_us": ga_total,
            "ga_vs_p1_kernel": statistics.median(ratio), "ga_vs_p1_kernel_range": [min(ratio), max(ratio)],
            "p1_rest_share": statistics.median(p1_rest), "ga_gemm_share": ga_gemm / ga_total,
            "ga_attention_share": ga_att / ga_total, "ga_rest_share": ga_rest / ga_total,
            "ga_gemm_att_vs_p1_gemm_att": (ga_gemm + ga_att) / (p1_gemm + p1_att),
            "bound_ga_vs_p1_if_ga_rest_vanished": statistics.median(bound),
            "ga_rest_types": [[k, v, v / ga_total] for k, v in rest_types],
            "per_type_us": {k: [p1.get(k, 0.0), ga.get(k, 0.0)] for k in types},
            "ga": fused}


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def markdown(result: dict) -> str:
    rows = result["cases"]
    L = ["# Where graph-autofusion's fused real-width models still spend time (GA beside P1, per operator type)", "",
         f"{result['hardware']}; onnxruntime {result['onnxruntime']}; 1 intra-op thread, ORT_ENABLE_ALL for both; "
         f"both sessions profiled at once, {result['runs']} interleaved rounds (one run of each) after 3 warm-up runs, "
         "process warmed by a throw-away session, random creation order; kernel time from ORT's profiler (per-node "
         f"framework overhead is not in it). GLIBC_TUNABLES={result['glibc_tunables'] or '(unset)'}. Load (1 min) at "
         f"start / end: {result['load'][0]:.2f} / {result['load'][1]:.2f}; the machine (2 cores) was shared with other "
         "jobs, so absolute µs are noisy; ratios are medians of per-round paired ratios (both runs of a round see the "
         "same load), per-type times and shares are per-type medians over rounds.", "",
         "GA = `graph-autofusion` as a user runs it (calibrated, end-to-end checked, verified), "
         f"{result['ga_version']}. GEMM = MatMul, Gemm, FusedMatMul, FusedGemm; attention = Attention, "
         "MultiHeadAttention, GroupQueryAttention, Softmax (the packed `Attention` op holds its Q/K/V GEMM too); "
         "rest = everything else. **Bound** = median over rounds of (GA kernel time - GA rest) / P1 kernel time: the "
         "GA/P1 a case reaches if every remaining non-GEMM, non-attention kernel of GA's output vanished and nothing "
         "else changed - optimistic, not a target." + (f" Run: `{result['command']}`." if result.get("command") else ""), "",
         "| case | GA/P1 (kernel) [range] | GA (GEMM+attention) / P1 (GEMM+attention) | P1 rest | GA GEMM | "
         "GA attention | GA rest | bound | GA's largest rest types (share of GA kernel time) | GA kinds kept |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        top = ", ".join(f"{k} {s:.1%}" for k, _, s in r["ga_rest_types"][:6])
        lo, hi = r["ga_vs_p1_kernel_range"]
        L.append(f"| {r['case']} | {r['ga_vs_p1_kernel']:.3f} [{lo:.3f}-{hi:.3f}] | "
                 f"{r['ga_gemm_att_vs_p1_gemm_att']:.3f} | {r['p1_rest_share']:.1%} | {r['ga_gemm_share']:.1%} | "
                 f"{r['ga_attention_share']:.1%} | {r['ga_rest_share']:.1%} | "
                 f"{r['bound_ga_vs_p1_if_ga_rest_vanished']:.3f} | {top} | {', '.join(r['ga']['kept_rules']) or '-'} |")
    s = result["summary"]
    L += ["", f"- geometric mean of the bound: **{s['geomean_bound']:.3f}** (issue 25 asks GA/P1 <= 0.97); "
          f"encoders only: {s['geomean_bound_encoders']:.3f}" if s.get("geomean_bound_encoders") else
          f"- geometric mean of the bound: **{s['geomean_bound']:.3f}**",
          f"- geometric mean of GA/P1 in kernel time (this profile): {s['geomean_ga_vs_p1_kernel']:.3f}", "",
          "## GA's remaining rest, summed over the encoder cases (targets)", "",
          "Share = the type's kernel time over the summed GA kernel time of the encoder cases.", "",
          "| operator type | share of GA kernel time | µs per run, summed over cases |", "|---|---:|---:|"]
    for k, us, share in s["encoder_rest_types"][:15]:
        L.append(f"| {k} | {share:.2%} | {us:.0f} |")
    L += ["", "## Per operator type, P1 -> GA (median µs per run, types above 1 % of either)", ""]
    for r in rows:
        tot = max(r["p1_kernel_us"], r["ga_kernel_us"])
        items = [(k, a, b) for k, (a, b) in r["per_type_us"].items() if max(a, b) >= 0.01 * tot]
        L.append(f"- {r['case']} (total {r['p1_kernel_us']:.0f} -> {r['ga_kernel_us']:.0f}): "
                 + ", ".join(f"{k} {a:.0f} -> {b:.0f}" for k, a, b in items))
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(realsuite.CASES))
    p.add_argument("--exporters", default=",".join(EXPORTERS))
    p.add_argument("--runs", type=int, default=10, help="profiled interleaved rounds (one run of P1 and of GA each)")
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"))
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "superkernel_op_shares_ga"),
                   help="where GA's fused models, reports and calibration cache are kept")
    p.add_argument("--refuse", action="store_true", help="fuse again even when a fused model is in --work")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--name", default="onnx_op_shares_ga")
    p.add_argument("--ga-version", default="", help="what GA was (e.g. the git commit), for the report")
    args = p.parse_args(argv)
    import onnxruntime as ort
    import torch

    from superkernel.tools.advisor.environment import hardware

    cases, exporters = selection(args.cases, args.exporters)
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    load_start = os.getloadavg()[0]
    cache = os.path.join(args.work, "calibration.json")
    rows = []
    for case in cases:
        for exporter in exporters:
            src = model_path(args.models, case, exporter)
            fused = fuse(src, os.path.join(args.work, f"{case}_{exporter}"), cache, args.refuse)
            row = case_row(f"{case}/{exporter}", profile_pair(src, fused["path"], args.runs, seed=len(rows)), fused)
            rows.append(row)
            print(f"{row['case']}: GA/P1 kernel {row['ga_vs_p1_kernel']:.3f}, GA rest {row['ga_rest_share']:.1%}, "
                  f"bound {row['bound_ga_vs_p1_if_ga_rest_vanished']:.3f}", flush=True)
    encoders = [r for r in rows if not r["case"].startswith("qwen2_decode")]
    enc_rest: collections.Counter[str] = collections.Counter()
    for r in encoders:
        for k, us, _ in r["ga_rest_types"]:
            enc_rest[k] += us
    enc_total = sum(r["ga_kernel_us"] for r in encoders) or 1.0
    summary = {"geomean_bound": geomean(r["bound_ga_vs_p1_if_ga_rest_vanished"] for r in rows),
               "geomean_bound_encoders": geomean(r["bound_ga_vs_p1_if_ga_rest_vanished"] for r in encoders),
               "geomean_ga_vs_p1_kernel": geomean(r["ga_vs_p1_kernel"] for r in rows),
               "encoder_rest_types": [[k, us, us / enc_total] for k, us in enc_rest.most_common()]}
    result = {"benchmark": args.name, "hardware": hardware(torch.device("cpu")).split(", torch threads")[0] + ")",
              "onnxruntime": ort.__version__, "runs": args.runs, "ga_version": args.ga_version or "this checkout",
              "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
              "command": " ".join(["benchmarks/studies/onnx_op_shares_ga.py", *(argv if argv is not None else sys.argv[1:])]),
              "load": [load_start, os.getloadavg()[0]], "summary": summary, "cases": rows}
    write_results(args.out, args.name, result, markdown(result), indent=1)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
