"""graph-autofusion on tiny Hugging Face models from both PyTorch exporters, against ORT's own optimizers.

The baselines are what users would otherwise run, all measured in one process run.

    .venv/bin/python benchmarks/onnx_autofusion.py [--quick] [--repeat N] [--cases bert,llama_decode]

Suite (superkernel.onnx.hfsuite, seeded random weights, batch 1, sequence 64): BERT,
DistilBERT, BART encoder, ViT, GPT-2, T5 encoder, Llama, and a Llama decode step with past
key/value (127 past positions), each exported with ``dynamo=False`` (opset 17) and
``dynamo=True`` (opset 18). Per case:

- P1: the original with ONNX Runtime ``ORT_ENABLE_ALL``;
- P2: ``onnxruntime.transformers.optimizer.optimize_model`` (model type per family, opt_level 0,
  so ONNX Runtime's own session optimizations run at load like for every other config);
- P3: onnxscript ``optimize_for_ort``;
- GA: ``graph-autofusion`` (calibrated, end-to-end checked, verified) through its command line.

All four run with ``ORT_ENABLE_ALL``, 1 intra-op thread, interleaved (one run of each per
round, the order rotated every round), median of ``--repeat`` rounds. Each row: fused op kinds per tool (op types in the
tool's output that the original does not have; for P1 those of ONNX Runtime's optimized
graph), max |diff| against the original (``ORT_DISABLE_ALL``) on the same seeded inputs,
latency ratio of GA vs P1 and vs the better of P2/P3 (a baseline whose output fails the
tolerance or does not load is left out of "best"). Ratios are medians of per-round paired
ratios (the runs of one round see the same load of the shared machine). Geometric means
over the suite at the end.
Writes benchmarks/results/onnx_autofusion.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import onnx
import onnxruntime as ort

from superkernel.onnx import hfsuite
from superkernel.onnx import timing as T
from superkernel.onnx import verify as V
from superkernel.onnx.cli import main as gaf
from superkernel.util import atomic_write, cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
P2_TYPE = {"bert": "bert", "distilbert": "bert", "bart_encoder": "bart", "vit": "vit", "gpt2": "gpt2",
           "t5_encoder": "t5", "llama": "gpt2", "llama_decode": "gpt2"}
TOOLS = ("P1", "P2", "P3", "GA")


def op_types(path: str) -> set[str]:
    m = onnx.load(path, load_external_data=False)
    return {(f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in m.graph.node}


def p1_kinds(path: str, tmp: str, base: set[str]) -> list[str]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = os.path.join(tmp, "p1_optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sorted(op_types(so.optimized_model_filepath) - base)


def run_p2(src: str, dst: str, model_type: str, heads: int = hfsuite.HEADS, hidden: int = hfsuite.HIDDEN) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    m = optimize_model(src, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False)
    m.save_model_to_file(dst)


def run_p3(src: str, dst: str) -> None:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(src)
    model, _counts = optimize_for_ort(model)
    # Its large tensors into a data file of its own beside ``dst``: saved as they were, they would
    # name the source's external data file relative to ``dst``'s folder, where it does not exist.
    ir.save(model, dst, external_data=os.path.basename(dst) + ".data")


def max_diff(ref: list, out: list) -> float:
    worst = 0.0
    for a, b in zip(ref, out):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return float("inf")
        if a.size:
            d = np.abs(a - b)
            d = np.where(np.isnan(a) & np.isnan(b), 0.0, d)
            worst = max(worst, float(np.nanmax(np.where(np.isnan(d), np.inf, d))))
    return worst


def within_tol(ref: list, out: list) -> bool:
    for a, b in zip(ref, out):
        a = np.asarray(a)
        if a.dtype.kind == "f":
            at, rt = V.tolerance(str(a.dtype))
            b = np.asarray(b)
            if a.shape != b.shape or not np.all(np.abs(a - b) <= at + rt * np.abs(a)):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def time_all(paths: dict[str, str], feeds: dict, repeat: int, warmup: int, seed: int = 0,
             max_seconds: float | None = None) -> tuple[dict[str, list[float]], list[str]]:
    """ms per round of every tool. The process is warmed with a throw-away session and the
    sessions are created in a seeded random order (superkernel.onnx.timing); rounds are
    interleaved, the order rotated every round. With ``max_seconds`` the rounds stop early
    (at least 20) once that much time is spent. Returns (samples, creation order)."""
    names = list(paths)
    make = [lambda p=paths[k]: V.session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=1) for k in names]
    sessions, order = T.open_sessions(make, seed, warm_feeds=feeds)
    runs = [(s, feeds) for s in sessions]
    xs = [[] for _ in runs]
    t0 = time.perf_counter()
    chunk = 10 if max_seconds else repeat
    done = 0
    while done < repeat:
        n = min(chunk, repeat - done)
        for i, ts in enumerate(T.time_interleaved(runs, n, warmup if done == 0 else 0)):
            xs[i] += ts
        done += n
        if max_seconds and done >= 20 and time.perf_counter() - t0 > max_seconds:
            break
    return {k: [t * 1e3 for t in ts] for k, ts in zip(names, xs)}, [names[i] for i in order]


def paired(xs: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of a_i / b_i: the runs of one round see the same machine load."""
    return statistics.median(x / y for x, y in zip(xs[a], xs[b]))


def paired_ci(xs: dict[str, list[float]], a: str, b: str) -> list[float]:
    """95 % interval of that median (sign-test order statistics, superkernel.onnx.timing)."""
    e = T.ratio_estimate(list(zip(xs[b], xs[a])))
    return [e.lo, e.hi]


def run_case(family: str, exporter: str, tmp: str, repeat: int, warmup: int, *, src: str | None = None,
             p2: tuple[str, int, int] | None = None, seed: int = 0, max_seconds: float | None = None,
             calibration_cache: str | None = None, looks: int = 1) -> dict:
    """One model: P2, P3 and GA from ``src`` (default: the tiny suite's export of ``family``),
    accuracy of each against the original, then all four timed together. ``p2``: (model type,
    heads, hidden) for ORT's transformers optimizer (default: the tiny suite's).
    ``calibration_cache``: GA's micro-benchmark cache (default: a fresh one for this case).
    ``looks`` > 1: the ``repeat`` rounds are split over that many looks, each with fresh sessions
    (superkernel.onnx.timing.time_looks); ratios and intervals are then over looks."""
    name = f"{family}/{exporter}"
    d = os.path.join(tmp, f"{family}_{exporter}")
    os.makedirs(d, exist_ok=True)
    t_export = time.perf_counter()
    src = src or hfsuite.export(family, exporter, os.path.join(d, "model.onnx"))
    base = op_types(src)
    row: dict = {"case": name, "family": family, "exporter": exporter, "opset": 17 if exporter == "legacy" else 18,
                 "nodes": len(onnx.load(src, load_external_data=False).graph.node), "tools": {},
                 "export_seconds": time.perf_counter() - t_export}
    paths = {"P1": src}
    row["tools"]["P1"] = {"kinds": p1_kinds(src, d, base)}
    model_type, heads, hidden = p2 or (P2_TYPE[family], hfsuite.HEADS, hfsuite.HIDDEN)
    for tool, fn in (("P2", lambda dst: run_p2(src, dst, model_type, heads, hidden)),
                     ("P3", lambda dst: run_p3(src, dst))):
        dst = os.path.join(d, f"{tool}.onnx")
        t0 = time.perf_counter()
        try:
            fn(dst)
            V.session(dst, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # loads?
            paths[tool] = dst
            row["tools"][tool] = {"kinds": sorted(op_types(dst) - base), "seconds": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - a baseline that fails is recorded, not fatal
            row["tools"][tool] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    ga = os.path.join(d, "GA.onnx")
    rep = os.path.join(d, "GA_report.md")
    t0 = time.perf_counter()
    code = gaf(["--input", src, "--output", ga, "--report", rep, "--quiet", "--threads", "1",
                "--calibration-cache", calibration_cache or os.path.join(d, "calibration.json")])
    info = json.load(open(os.path.join(d, "GA_report.json")))
    ga_row = {"exit_code": code, "seconds": time.perf_counter() - t0,
              "kept_rules": sorted({c["rule"] for c in info.get("applied", [])}),
              "found_rules": sorted({c["rule"] for c in info.get("applied", []) + info.get("skipped", [])}),
              "near_miss_rules": sorted({m["rule"] for m in info.get("near_misses", [])}),
              "end_to_end": info.get("end_to_end"), "calibration": info.get("calibration"),
              "not_kept": sorted({(c["rule"], c["fused_op"]) for c in info.get("skipped", [])
                                  if c["reason"].startswith("not faster")})}
    if code == 0:
        paths["GA"] = ga
        ga_row["kinds"] = sorted(op_types(ga) - base)
    else:
        ga_row["error"] = info.get("message")
    row["tools"]["GA"] = ga_row
    # accuracy against the original, same seeded inputs
    s0 = V.session(src, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, {}, V.VERIFY_DEFAULT_DIM, 0)
    names = [o.name for o in s0.get_outputs()]
    ref = s0.run(names, feeds)
    for tool, p in list(paths.items()):
        try:
            out = V.session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL).run(names, feeds)
            row["tools"][tool]["max_abs_diff"] = max_diff(ref, out)
            row["tools"][tool]["within_tolerance"] = within_tol(ref, out)
        except Exception as e:  # noqa: BLE001
            row["tools"][tool]["error"] = f"run: {type(e).__name__}: {str(e)[:200]}"
            paths.pop(tool)
    if looks > 1:  # fresh sessions per look: the look is the unit (superkernel.onnx.timing.time_looks)
        names = list(paths)
        make = [lambda p=paths[k]: V.session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=1) for k in names]
        per = T.time_looks(make, feeds, looks=looks, rounds=max(5, repeat // looks), warmup=warmup, seed=seed,
                           max_seconds=max_seconds)
        samples = {k: [t * 1e3 for look in per for t in look[i]] for i, k in enumerate(names)}
        row["looks"] = len(per)
        row["session_order"] = "random per look"

        def ratio(a: str, b: str) -> tuple[float, list[float]]:
            e = T.looks_estimate(per, names.index(b), names.index(a))
            return e.ratio, [e.lo, e.hi]
    else:
        samples, order = time_all(paths, feeds, repeat, warmup, seed=seed, max_seconds=max_seconds)
        row["session_order"] = order

        def ratio(a: str, b: str) -> tuple[float, list[float]]:
            return paired(samples, a, b), paired_ci(samples, a, b)
    row["rounds"] = len(samples["P1"])
    huge = T.anon_huge_pages_kb()
    if huge is not None:
        row["anon_huge_pages_kb"] = huge  # > 0: this process's buffers are on transparent huge pages
    times = {k: statistics.median(v) for k, v in samples.items()}
    for tool, t in times.items():
        sp = T.spread(samples[tool])
        row["tools"][tool].update(median_ms=t, min_ms=sp["min"], p25_ms=sp["p25"], p75_ms=sp["p75"])
        if tool != "P1":
            row["tools"][tool]["vs_p1"], row["tools"][tool]["vs_p1_ci"] = ratio(tool, "P1")
    if "GA" in times:
        row["ga_vs_p1"], row["ga_vs_p1_ci"] = ratio("GA", "P1")
        best = [t for t in ("P2", "P3") if t in times and row["tools"][t].get("within_tolerance")]
        if best:
            b = min(best, key=lambda t: times[t])
            row["best_p2_p3"] = b
            row["ga_vs_best_p2_p3"], row["ga_vs_best_p2_p3_ci"] = ratio("GA", b)
            row["best_p2_p3_vs_p1"] = ratio(b, "P1")[0]
        else:
            row["ga_vs_best_p2_p3"] = row["best_p2_p3_vs_p1"] = None
    row["peers_slower_than_p1"] = [t for t in ("P2", "P3") if row["tools"].get(t, {}).get("vs_p1_ci", [0])[0] > 1.0]
    return row


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def ci(r: dict, key: str) -> str:
    """'ratio [lo-hi]' (95 % interval of the median paired ratio) or '-'."""
    if not r.get(key):
        return "-"
    lo_hi = r.get(key + "_ci")
    return f"{r[key]:.3f}" + (f" [{lo_hi[0]:.3f}-{lo_hi[1]:.3f}]" if lo_hi else "")


def markdown(result: dict) -> str:
    hw = result["hardware"]
    L = ["# graph-autofusion vs ONNX Runtime baselines (tiny Hugging Face models)", "",
         f"Hardware: {hw['cpu']}, {hw['cores']} cores (shared); onnxruntime {hw['onnxruntime']}, "
         f"onnxscript {hw['onnxscript']}, torch {hw['torch']}, transformers {hw['transformers']}. "
         + (f"1 intra-op thread, median of {result['repeat']} interleaved rounds after {result['warmup']} warm-up rounds, "
            "all in one process run, warmed by a throw-away session, sessions created in a random order; ratios are "
            "medians of per-round paired ratios with their 95 % interval [lo-hi]. "
            if result.get("looks", 1) <= 1 else
            f"1 intra-op thread, {result['repeat']} interleaved rounds per case split over {result['looks']} looks, each "
            f"with fresh sessions created in its own random order (after {result['warmup']} warm-up rounds), all in one "
            "process run warmed by a throw-away session; ratios are medians over looks of each look's median "
            "per-round paired ratio, [lo-hi] the sign-test interval over looks (with up to 8 looks, their range): the "
            "session created first in a look runs a few % slower even after the warm-up "
            "(onnx_session_order.md), and looks spread that over the tools. ")
         + f"Load (1-min average) at start / end: {result.get('load', ['?', '?'])[0]} / {result.get('load', ['?', '?'])[1]}. P1 ORT_ENABLE_ALL on the original, P2 ORT transformers optimizer, P3 onnxscript "
         "optimize_for_ort, GA graph-autofusion (calibrated, end-to-end checked, verified).", "",
         "| case | P1 ms | P2 ms | P3 ms | GA ms | GA/P1 | GA/best(P2,P3) | max abs diff P2 / P3 / GA | "
         "P2 kinds | P3 kinds | GA kinds kept | GA rules found, not kept (measured slower) | GA dropped end-to-end |",
         "|" + "---|" * 13]
    for r in result["cases"]:
        t = r.get("tools", {})
        if "error" in r:
            L.append(f"| {r['case']} | error: {r['error']} |" + " |" * 12)
            continue

        def ms(k):
            v = t.get(k, {})
            return f"{v['median_ms']:.3f}" if "median_ms" in v else ("fail" if "error" in v else "-")

        def diff(k):
            v = t.get(k, {})
            if "max_abs_diff" not in v:
                return "fail"
            return f"{v['max_abs_diff']:.1e}" + ("" if v.get("within_tolerance") else " (!)")

        ga = t.get("GA", {})
        e2e = ga.get("end_to_end") or {}
        L.append(" | ".join([
            f"| {r['case']}", ms("P1"), ms("P2"), ms("P3"), ms("GA"),
            ci(r, "ga_vs_p1"), ci(r, "ga_vs_best_p2_p3"),
            f"{diff('P2')} / {diff('P3')} / {diff('GA')}",
            ", ".join(t.get("P2", {}).get("kinds", [])) or "-",
            ", ".join(t.get("P3", {}).get("kinds", [])) or "-",
            ", ".join(ga.get("kinds", [])) or "-",
            ", ".join(sorted({rule for rule, _op in ga.get("not_kept", [])})) or "-",
            ", ".join(e2e.get("dropped_rules", [])) or "-"]) + " |")
    s = result["summary"]
    L += ["", f"- geometric mean GA / P1: **{s['geomean_ga_vs_p1']:.3f}**" if s["geomean_ga_vs_p1"] else "",
          f"- geometric mean GA / best of P2, P3: **{s['geomean_ga_vs_best_p2_p3']:.3f}**"
          if s["geomean_ga_vs_best_p2_p3"] else "",
          f"- geometric mean best of P2, P3 / P1: {s['geomean_best_p2_p3_vs_p1']:.3f}"
          if s["geomean_best_p2_p3_vs_p1"] else "",
          f"- worst GA / P1: {s['worst_ga_vs_p1']:.3f} ({s['worst_case']})" if s["worst_ga_vs_p1"] else "",
          "- decode step (Llama with past K/V) GA / P1: "
          + ", ".join(f"{k} {v:.3f}" for k, v in s["decode_ga_vs_p1"].items()),
          "", "(!) = outside graph-autofusion's per-dtype tolerance against the original.", ""]
    return "\n".join(x for x in L if x is not None) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="30 rounds, 5 warm-up (smoke test)")
    p.add_argument("--cases", default="", help="comma-separated families (default: all)")
    p.add_argument("--exporters", default="legacy,dynamo")
    p.add_argument("--looks", type=int, default=1,
                   help="split each case's rounds over this many looks, each with fresh sessions created in their own "
                        "random order; ratios are then medians over looks (default 1: one session per tool)")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    repeat, warmup = (30, 5) if a.quick else (a.repeat, a.warmup)
    families = [c for c in (a.cases.split(",") if a.cases else hfsuite.CASES) if c]
    exporters = [e for e in a.exporters.split(",") if e]
    import onnxscript
    import torch
    import transformers

    hw = {"cpu": cpu_name(), "cores": os.cpu_count(), "onnxruntime": ort.__version__,
          "onnxscript": onnxscript.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
          "python": sys.version.split()[0]}
    rows = []
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            for exp in exporters:
                t0 = time.perf_counter()
                try:
                    row = run_case(fam, exp, tmp, repeat, warmup, seed=len(rows), looks=a.looks)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    row = {"case": f"{fam}/{exp}", "error": f"{type(e).__name__}: {str(e)[:200]}"}
                row["case_seconds"] = time.perf_counter() - t0
                rows.append(row)
                t = row.get("tools", {})
                print(f"{row['case']:<22} " + "  ".join(
                    f"{k} {t[k]['median_ms']:.3f}" for k in TOOLS if "median_ms" in t.get(k, {}))
                    + (f"  GA/P1 {row['ga_vs_p1']:.3f}" if row.get("ga_vs_p1") else "")
                    + (f"  GA/best {row['ga_vs_best_p2_p3']:.3f}" if row.get("ga_vs_best_p2_p3") else "")
                    + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
    ok = [r for r in rows if r.get("ga_vs_p1")]
    worst = max(ok, key=lambda r: r["ga_vs_p1"]) if ok else None
    summary = {
        "geomean_ga_vs_p1": geomean(r["ga_vs_p1"] for r in ok),
        "geomean_ga_vs_best_p2_p3": geomean(r.get("ga_vs_best_p2_p3") for r in ok),
        "geomean_best_p2_p3_vs_p1": geomean(r.get("best_p2_p3_vs_p1") for r in ok),
        "worst_ga_vs_p1": worst["ga_vs_p1"] if worst else None, "worst_case": worst["case"] if worst else None,
        "decode_ga_vs_p1": {r["case"]: r["ga_vs_p1"] for r in ok if r["family"] == "llama_decode"},
        "cases": len(rows), "failed": [r["case"] for r in rows if not r.get("ga_vs_p1")],
        "seconds": time.perf_counter() - t_start,
    }
    result = {"benchmark": "onnx_autofusion", "hardware": hw, "repeat": repeat, "warmup": warmup, "threads": 1,
              "looks": a.looks,
              "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
              "summary": summary, "cases": rows}
    os.makedirs(a.out, exist_ok=True)
    atomic_write(os.path.join(a.out, "onnx_autofusion.json"), json.dumps(result, indent=2, default=str))
    atomic_write(os.path.join(a.out, "onnx_autofusion.md"), markdown(result))
    print(json.dumps({k: v for k, v in summary.items() if k != "cases"}, indent=1, default=str))
    print(f"results: {os.path.join(a.out, 'onnx_autofusion.json')} and .md")
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
