"""Does one graph-autofusion rule pay at real width? GA with and without it, against P1, in one process.

    .venv/bin/python benchmarks/onnx_rule_ab.py --rule sum_layernorm [--cases bert_base,clip_text] [--looks 4]

Per case of ``superkernel.onnx.realsuite`` (exports cached in ``--models`` as by
``onnx_real_width.py``): graph-autofusion fuses the export twice, as a user runs it (calibrated,
end-to-end checked, verified, 1 thread, one calibration cache for both), once with every rule
(``GA``) and once with ``all,-RULE`` (``GA-RULE``). Then P1 (ORT_ENABLE_ALL on the original),
GA-RULE and GA are timed together with the real-width suite's harness
(``superkernel.onnx.timing.time_looks``: warmed process, ``--looks`` looks with fresh sessions
created in a random order each, interleaved rounds; ratios are medians over looks of each look's
median per-round paired ratio, intervals over looks). The ratio that decides is GA / GA-RULE:
below 1 the rule pays on that case. Writes benchmarks/results/<--name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import onnx_autofusion as OA  # noqa: E402 - the shared harness
from onnx_real_width import EXPORTERS, model_path, selection  # noqa: E402

from superkernel.onnx import catalog, realsuite  # noqa: E402
from superkernel.util import write_results  # noqa: E402


def fuse(src: str, out: str, rules: str, cache: str) -> dict:
    from superkernel.onnx.cli import main as gaf

    t0 = time.perf_counter()
    report = out[:-len(".onnx")] + "_report.md"
    code = gaf(["--input", src, "--output", out, "--report", report, "--quiet", "--threads", "1",
                "--fusion-rules", rules, "--calibration-cache", cache])
    with open(report[:-3] + ".json", encoding="utf-8") as f:
        info = json.load(f)
    if code != 0:
        raise RuntimeError(f"graph-autofusion exited {code} on {src}: {info.get('message')}")
    e2e = info.get("end_to_end") or {}
    return {"seconds": time.perf_counter() - t0, "kept_rules": sorted({c["rule"] for c in info.get("applied", [])}),
            "end_to_end": {k: e2e.get(k) for k in ("ratio", "ratio_lo", "ratio_hi", "verdict", "dropped_rules")}}


def run_case(case: str, exporter: str, rule: str, models: str, work: str, looks: int, rounds: int,
             seed: int) -> dict:
    import onnxruntime as ort

    from superkernel.onnx import timing as T
    from superkernel.onnx import verify as V

    src = model_path(models, case, exporter)
    d = os.path.join(work, f"{case}_{exporter}")
    os.makedirs(d, exist_ok=True)
    cache = os.path.join(work, "calibration.json")
    paths = {"P1": src, "GA-rule": os.path.join(d, "GA_without.onnx"), "GA": os.path.join(d, "GA.onnx")}
    row = {"case": f"{case}/{exporter}", "ga_without": fuse(src, paths["GA-rule"], f"all,-{rule}", cache),
           "ga": fuse(src, paths["GA"], "all", cache)}
    row["rule_kept"] = rule in row["ga"]["kept_rules"]
    s0 = V.session(src, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, {}, V.VERIFY_DEFAULT_DIM, 0)
    names = [o.name for o in s0.get_outputs()]
    ref = s0.run(names, feeds)
    del s0
    for k in ("GA-rule", "GA"):
        out = V.session(paths[k], ort.GraphOptimizationLevel.ORT_ENABLE_ALL).run(names, feeds)
        row[f"max_abs_diff_{k}"] = OA.max_diff(ref, out)
    keys = list(paths)
    make = [lambda p=paths[k]: V.session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=1) for k in keys]
    per = T.time_looks(make, feeds, looks=looks, rounds=rounds, warmup=3, seed=seed)
    row["looks"], row["rounds_per_look"] = len(per), rounds
    for a, b, name in (("P1", "GA", "ga_vs_p1"), ("P1", "GA-rule", "ga_without_vs_p1"), ("GA-rule", "GA", "ga_vs_ga_without")):
        e = T.looks_estimate(per, keys.index(a), keys.index(b))
        row[name] = [e.ratio, e.lo, e.hi]
    for i, k in enumerate(keys):
        xs = [t * 1e3 for look in per for t in look[i]]
        row[f"median_ms_{k}"] = T.spread(xs)["median"]
    return row


def markdown(result: dict) -> str:
    r0 = result
    L = [f"# Rule A/B at real width: `{r0['rule']}` (GA with every rule vs GA without it, beside P1)", "",
         f"{r0['hardware']}; onnxruntime {r0['onnxruntime']}; 1 intra-op thread, ORT_ENABLE_ALL for all; "
         f"GLIBC_TUNABLES={r0['glibc_tunables'] or '(unset)'}; {r0['looks']} looks x {r0['rounds']} interleaved rounds "
         f"per case (fresh sessions per look, random creation order); ratios = median over looks of each look's "
         f"median paired ratio, [range over looks]. Load (1 min) at start / end: {r0['load'][0]:.2f} / "
         f"{r0['load'][1]:.2f} (2 cores shared with other jobs). Both GA models calibrated and end-to-end checked "
         f"in this run, one calibration cache. Run: `{r0.get('command', '')}`.", "",
         f"| case | P1 ms | GA-{r0['rule']} ms | GA ms | **GA / GA-{r0['rule']}** | GA / P1 | GA-{r0['rule']} / P1 | "
         "rule kept | GA end-to-end check | max abs diff GA |", "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in r0["cases"]:
        if "error" in r:
            L.append(f"| {r['case']} | error: {r['error']} |" + " |" * 8)
            continue

        def f3(v):
            return f"{v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}]"

        e = r["ga"]["end_to_end"]
        L.append(f"| {r['case']} | {r['median_ms_P1']:.2f} | {r['median_ms_GA-rule']:.2f} | {r['median_ms_GA']:.2f} | "
                 f"**{f3(r['ga_vs_ga_without'])}** | {f3(r['ga_vs_p1'])} | {f3(r['ga_without_vs_p1'])} | "
                 f"{'yes' if r['rule_kept'] else 'no'} | {e.get('ratio') or 0:.3f} {e.get('verdict') or ''} | "
                 f"{r['max_abs_diff_GA']:.1e} |")
    s = r0["summary"]
    if s.get("geomean_ga_vs_ga_without"):
        L += ["", f"Geometric means over these cases: GA / GA-{r0['rule']} {s['geomean_ga_vs_ga_without']:.3f}, "
              f"GA / P1 {s['geomean_ga_vs_p1']:.3f}, GA-{r0['rule']} / P1 {s['geomean_ga_without_vs_p1']:.3f}."]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rule", required=True)
    p.add_argument("--cases", default=",".join(realsuite.CASES))
    p.add_argument("--exporters", default=",".join(EXPORTERS))
    p.add_argument("--looks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds per look")
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"))
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "superkernel_rule_ab"))
    p.add_argument("--out", default=OA.RESULTS)
    p.add_argument("--name", default="")
    a = p.parse_args(argv)
    import onnxruntime as ort

    if a.rule not in catalog.BY_NAME:
        raise SystemExit(f"unknown rule {a.rule!r}: choose from {', '.join(catalog.BY_NAME)}")
    cases, exporters = selection(a.cases, a.exporters)
    load0 = os.getloadavg()[0]
    rows = []
    for case in cases:
        for exp in exporters:
            try:
                row = run_case(case, exp, a.rule, a.models, a.work, a.looks, a.rounds, seed=len(rows))
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                row = {"case": f"{case}/{exp}", "error": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(row)
            print(f"{row['case']}: " + (f"GA/GA-{a.rule} {row['ga_vs_ga_without'][0]:.3f}, GA/P1 {row['ga_vs_p1'][0]:.3f}"
                                        if "error" not in row else row["error"]), flush=True)
    ok = [r for r in rows if "error" not in r]

    def gm(key):
        return math.exp(sum(math.log(r[key][0]) for r in ok) / len(ok)) if ok else None

    result = {"benchmark": "onnx_rule_ab", "rule": a.rule, "hardware": f"{OA.cpu_name()}, {os.cpu_count()} cores",
              "onnxruntime": ort.__version__, "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
              "looks": a.looks, "rounds": a.rounds, "load": [load0, os.getloadavg()[0]], "cases": rows,
              "command": " ".join(["benchmarks/onnx_rule_ab.py", *(argv if argv is not None else sys.argv[1:])]),
              "summary": {"geomean_ga_vs_ga_without": gm("ga_vs_ga_without"), "geomean_ga_vs_p1": gm("ga_vs_p1"),
                          "geomean_ga_without_vs_p1": gm("ga_without_vs_p1")}}
    md = markdown(result)
    write_results(a.out, a.name or f"onnx_rule_ab_{a.rule}", result, md)
    print(md)
    return 0 if ok and len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
