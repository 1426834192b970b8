"""graph-autofusion on ONNX Runtime-quantized exports of a Qwen2-0.5B-wide decode step, against ORT_ENABLE_ALL on
the same quantized model, in one process run.

    .venv/bin/python benchmarks/onnx_quantized.py [--layers 4] [--looks 6] [--rounds 120] [--malloc-hugepages]

Model: ``superkernel.onnx.realsuite`` ``qwen2_decode`` (hidden 896, 14 query / 2 key-value heads, FFN 4864, vocab
151936 with tied embeddings, q/k/v bias, one new token over 127 past positions, batch 1, seeded random weights),
``--layers`` layers, TorchScript exporter (opset 17). Quantized with the installed onnxruntime's own tools:

- ``int8_dynamic``: ``quantize_dynamic(weight_type=QInt8)``: DynamicQuantizeLinear + MatMulInteger (int8 weights
  per tensor, uint8 activations quantized per run), the embedding table int8 (Gather + DequantizeLinear);
- ``int4_weight_only``: ``MatMulNBitsQuantizer`` (block 32, symmetric, ``accuracy_level`` 0: float compute);
- ``int4_int8_compute``: the same with ``accuracy_level=4`` (int8 activations: ONNX Runtime's fast CPU path).

Per quantization: graph-autofusion through its command line (calibrated, end-to-end checked, verified,
``--threads 1``), whose record gives its own paired fused/original ratio; then, in this process, with the
project's timing (``superkernel.onnx.timing.time_looks``: a throw-away session, ``--looks`` looks of fresh sessions
created in a seeded random order, interleaved rounds, 1 intra-op thread), F (the float export), P1 (the quantized
export) and GA (its fused model), all ``ORT_ENABLE_ALL``. GA/P1 and P1/F are medians over looks of each look's
median paired ratio, with the sign-test interval over looks. Checks: GA's verification, every quantized node kept
(``superkernel.onnx.quant``), the same integer kernels in ONNX Runtime's optimized graph of P1 and GA, and what
quantization itself costs against the float export (max |logit| difference and top-1 agreement over
``--error-seeds`` random decode inputs). Writes benchmarks/results/onnx_quantized.json and .md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from superkernel.onnx import quant as Q
from superkernel.onnx import realsuite
from superkernel.onnx import timing as T
from superkernel.onnx import verify as V
from superkernel.onnx.cli import main as gaf
from superkernel.util import atomic_write, cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
QUANTIZATIONS = ("int8_dynamic", "int4_weight_only", "int4_int8_compute")
HUGE = "glibc.malloc.hugetlb=1"


def export_float(models: str, layers: int) -> str:
    p = os.path.join(models, f"qwen2_decode_{layers}l_legacy.onnx")
    if not os.path.exists(p):
        os.makedirs(models, exist_ok=True)
        tmp = p + ".part.onnx"
        realsuite.export("qwen2_decode", "legacy", tmp, layers=layers)
        os.replace(tmp, p)
    return p


def quantize(src: str, how: str) -> tuple[str, float]:
    """``src`` quantized ``how`` next to it (made once); returns (path, seconds it took, 0 when cached)."""
    dst = src.replace(".onnx", f"_{how}.onnx")
    if os.path.exists(dst):
        return dst, 0.0
    logging.getLogger().setLevel(logging.ERROR)  # the quantizers log every node
    t0 = time.perf_counter()
    tmp = dst + ".part.onnx"
    if how == "int8_dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src, tmp, weight_type=QuantType.QInt8, use_external_data_format=True)
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=True,
                                 accuracy_level=4 if how == "int4_int8_compute" else None)
        q.process()
        q.model.save_model_to_file(tmp, True)
    os.replace(tmp, dst)  # its weights stay in the data file written beside it, which it names
    return dst, time.perf_counter() - t0


def run_ga(src: str, work: str, calibration_cache: str) -> dict:
    out = os.path.join(work, os.path.basename(src).replace(".onnx", "_ga.onnx"))
    rep = out.replace(".onnx", ".md")
    t0 = time.perf_counter()
    code = gaf(["--input", src, "--output", out, "--report", rep, "--quiet", "--threads", "1",
                "--calibration-cache", calibration_cache])
    seconds = time.perf_counter() - t0
    info = json.load(open(rep.replace(".md", ".json")))
    e2e = info.get("end_to_end") or {}
    v = info.get("verification") or {}
    return {"exit_code": code, "path": out if code == 0 else None, "seconds": seconds,
            "applied": sorted({c["rule"] for c in info.get("applied", [])}),
            "applied_count": len(info.get("applied", [])),
            "dropped_rules": e2e.get("dropped_rules"),
            "guard_near_misses": [m for m in info.get("near_misses", []) if "quantized subgraph" in m["reason"]],
            "e2e": {k: e2e.get(k) for k in ("ratio", "ratio_lo", "ratio_hi", "verdict", "rounds", "timed_in",
                                            "original_ms", "fused_ms", "looks_disagreed", "error")},
            "verification": {"ok": v.get("ok"), "quantization_floor": v.get("quantization_floor"),
                             "outputs": [{k: o.get(k) for k in ("name", "max_abs_diff", "quantization_floor", "ok")}
                                         for o in v.get("outputs", [])]},
            "message": info.get("message")}


def quant_error(float_path: str, q_path: str, seeds: int) -> dict:
    """What quantization itself costs: the quantized export against the float one on ``seeds`` random decode
    inputs (ORT_ENABLE_ALL both): max |logit| difference, top-1 agreement, the float logits' scale."""
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sf, sq = V.session(float_path, level, threads=1), V.session(q_path, level, threads=1)
    worst, agree, scale = 0.0, 0, 0.0
    for seed in range(seeds):
        feeds = V.make_inputs(sf, {}, V.VERIFY_DEFAULT_DIM, 100 + seed)
        a, b = sf.run(["logits"], feeds)[0], sq.run(["logits"], feeds)[0]
        worst = max(worst, float(np.abs(a - b).max()))
        scale = max(scale, float(np.abs(a).max()))
        agree += int(np.array_equal(a.argmax(-1), b.argmax(-1)))
    return {"max_logit_diff": worst, "max_abs_logit": scale, "top1_agree": agree, "inputs": seeds}


def timed(paths: dict[str, str], looks: int, rounds: int, warmup: int, seed: int) -> dict:
    names = list(paths)
    s0 = V.session(paths["P1"], ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, {}, V.VERIFY_DEFAULT_DIM, 0)
    del s0
    make = [lambda p=paths[k]: V.session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=1) for k in names]
    t0 = time.perf_counter()
    per = T.time_looks(make, feeds, looks=looks, rounds=rounds, warmup=warmup, seed=seed)
    out: dict = {"looks": len(per), "rounds_per_look": rounds, "seconds": time.perf_counter() - t0}
    for i, k in enumerate(names):
        xs = [t * 1e3 for look in per for t in look[i]]
        out[f"{k}_ms"] = statistics.median(xs)
        out[f"{k}_look_medians_ms"] = [statistics.median(look[i]) * 1e3 for look in per]

    def ratio(b: str, a: str) -> dict:
        e = T.looks_estimate(per, names.index(a), names.index(b))
        return {"ratio": e.ratio, "lo": e.lo, "hi": e.hi}

    if "GA" in paths:
        out["GA_vs_P1"] = ratio("GA", "P1")
    if "F" in paths:
        out["P1_vs_F"] = ratio("P1", "F")
        if "GA" in paths:
            out["GA_vs_F"] = ratio("GA", "F")
    huge = T.anon_huge_pages_kb()
    if huge is not None:
        out["anon_huge_pages_kb"] = huge
    return out


def run_case(how: str, float_path: str, work: str, a) -> dict:
    row: dict = {"quantization": how, "load_start": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    src, qs = quantize(float_path, how)
    row["quantize_seconds"] = qs
    row["quantized_ops"] = Q.quantized_op_counts(ir.load(src).graph)
    row["ort_kernels_p1"] = Q.ort_kernel_counts(src)
    ga = run_ga(src, work, os.path.join(work, "calibration.json"))
    row["ga"] = ga
    paths = {"F": float_path, "P1": src}
    if ga["path"]:
        row["quantized_ops_ga"] = Q.quantized_op_counts(ir.load(ga["path"]).graph)
        row["ort_kernels_ga"] = Q.ort_kernel_counts(ga["path"])
        row["quantized_nodes_kept"] = row["quantized_ops_ga"] == row["quantized_ops"]
        row["kernels_changed"] = Q.kernels_kept(row["ort_kernels_p1"], row["ort_kernels_ga"])
        paths["GA"] = ga["path"]
    row["quant_error"] = quant_error(float_path, src, a.error_seeds)
    row["timing"] = timed(paths, a.looks, a.rounds, a.warmup, a.seed)
    row["load_end"] = round(os.getloadavg()[0], 2)
    row["case_seconds"] = time.perf_counter() - t0
    return row


def _ci(d: dict | None) -> str:
    if not d or d.get("ratio") is None:
        return "-"
    return f"{d['ratio']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def markdown(res: dict) -> str:
    hw = res["hardware"]
    L = ["# graph-autofusion on ONNX Runtime-quantized Qwen2-0.5B-wide decode steps", "",
         f"{hw['cpu']}, {hw['cores']} cores (shared with other work), onnxruntime {hw['onnxruntime']}, 1 intra-op "
         f"thread; load average (1 min) {res['load'][0]} at the start, {res['load'][1]} at the end; `uptime` at the "
         f"start: `{res['uptime_start']}`; at the end: `{res['uptime_end']}`."
         + (" Every timing process on transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`)."
            if res.get("malloc_hugepages") else ""), "",
         f"Model: `realsuite` qwen2_decode, {res['layers']} layers (hidden 896, 14/2 heads, FFN 4864, vocab 151936, "
         "127 past positions, batch 1), TorchScript exporter, quantized with onnxruntime's own tools. "
         f"Timing: {res['looks']} looks of fresh sessions x {res['rounds']} interleaved rounds "
         "(`superkernel.onnx.timing.time_looks`), all `ORT_ENABLE_ALL`; ratios are medians over looks of each "
         "look's median paired ratio, [95 % sign-test interval over looks]. "
         "GA's own end-to-end ratio is its command line's paired check (fused/original, 1 % tolerance).", "",
         "| quantization | ORT kernels (P1) | GA rules kept | GA verified | quantized nodes kept / ORT kernels | "
         "P1 ms | GA ms | **GA/P1** | GA e2e fused/original | F ms | P1/F | quantization error vs float | "
         "GA fuse s |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["cases"]:
        if "error" in r:
            L.append(f"| {r['quantization']} | error: {r['error']} |" + " |" * 11)
            continue
        ga, t, e = r["ga"], r["timing"], r["quant_error"]
        v = ga["verification"]
        floors = [o for o in v.get("outputs", []) if o.get("quantization_floor") is not None]
        ver = ("yes" if v.get("ok") else "NO") + (f" (by the quantization floor on {len(floors)} outputs)"
                                                  if floors and v.get("ok") else "")
        kernels = ", ".join(f"{k.split('::')[-1]} {n}" for k, n in r["ort_kernels_p1"].items())
        kept = ("yes" if r.get("quantized_nodes_kept") else "NO") + " / " + (
            "same" if not r.get("kernels_changed") else r["kernels_changed"])
        e2e = ga["e2e"]
        e2e_s = (f"{e2e['ratio']:.3f} [{e2e['ratio_lo']:.3f}, {e2e['ratio_hi']:.3f}] {e2e['verdict']}"
                 if e2e.get("ratio") is not None else (e2e.get("error") or "-"))
        rules = ", ".join(ga["applied"]) or "none"
        if ga.get("dropped_rules"):
            rules += f" (dropped: {', '.join(ga['dropped_rules'])})"
        L.append(f"| {r['quantization']} | {kernels} | {rules} | {ver} | {kept} | {t['P1_ms']:.2f} | "
                 f"{t.get('GA_ms', float('nan')):.2f} | **{_ci(t.get('GA_vs_P1'))}** | {e2e_s} | {t['F_ms']:.2f} | "
                 f"{_ci(t.get('P1_vs_F'))} | max diff {e['max_logit_diff']:.3g} (of {e['max_abs_logit']:.3g}), "
                 f"top-1 {e['top1_agree']}/{e['inputs']} | {ga['seconds']:.0f} |")
    L += ["", "Per case, load average (1 min) at start / end: "
          + ", ".join(f"{r['quantization']} {r.get('load_start')} / {r.get('load_end')}" for r in res["cases"]) + ".",
          "", "Verification is the product's own (both models `ORT_DISABLE_ALL`, seeded inputs); an output above the "
          "float tolerance of a model that quantizes activations at run time is held against the input's "
          "quantization floor (docs/graph_autofusion.md, \"Quantized models\"). \"ORT kernels\" are the quantized "
          "operators of ONNX Runtime's own optimized graph (`optimized_model_filepath`); \"same\" means the fused "
          "model's optimized graph runs the same integer kernels and no more (de)quantizations."]
    guard = [(r["quantization"], m) for r in res["cases"] if "ga" in r for m in r["ga"]["guard_near_misses"]]
    L += ["", "Candidates the quantization guard refused: "
          + ("; ".join(f"{q}: {m['rule']} at {m['node']} ({m['reason']})" for q, m in guard[:8]) if guard else "none")
          + "."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--quantizations", default=",".join(QUANTIZATIONS))
    p.add_argument("--looks", type=int, default=6)
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds per look")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--error-seeds", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_onnx_quantized_models"))
    p.add_argument("--malloc-hugepages", action="store_true",
                   help="re-run this process with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (ONNX Runtime's buffers on "
                        "transparent huge pages)")
    p.add_argument("--name", default="onnx_quantized")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    chosen = [q for q in a.quantizations.split(",") if q]
    if set(chosen) - set(QUANTIZATIONS):
        raise SystemExit(f"unknown quantization in {a.quantizations!r}: choose from {', '.join(QUANTIZATIONS)}")
    if a.malloc_hugepages and HUGE not in os.environ.get("GLIBC_TUNABLES", ""):
        env = dict(os.environ)
        env["GLIBC_TUNABLES"] = ":".join(x for x in (env.get("GLIBC_TUNABLES", ""), HUGE) if x)
        return subprocess.call([sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:])], env=env)
    uptime0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()[0]
    float_path = export_float(a.models, a.layers)
    res = {"hardware": {"cpu": cpu_name(), "cores": os.cpu_count(), "onnxruntime": ort.__version__},
           "layers": a.layers, "looks": a.looks, "rounds": a.rounds, "malloc_hugepages": a.malloc_hugepages,
           "uptime_start": uptime0, "cases": [], "complete": False}
    os.makedirs(a.out, exist_ok=True)
    out_json, out_md = os.path.join(a.out, f"{a.name}.json"), os.path.join(a.out, f"{a.name}.md")
    with tempfile.TemporaryDirectory() as work:
        for how in chosen:
            try:
                row = run_case(how, float_path, work, a)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                import traceback

                traceback.print_exc()
                row = {"quantization": how, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            res["cases"].append(row)
            res["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
            res["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            atomic_write(out_json, json.dumps(res, indent=1, default=str))
            t = row.get("timing", {})
            print(f"{how:<20} GA/P1 {_ci(t.get('GA_vs_P1'))}  P1/F {_ci(t.get('P1_vs_F'))}"
                  + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
    res["complete"] = True
    atomic_write(out_json, json.dumps(res, indent=1, default=str))
    atomic_write(out_md, markdown(res))
    print(f"wrote {out_json} and {out_md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
