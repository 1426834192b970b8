"""graph-autofusion at real width: GA against ONNX Runtime's own optimizers on models the size of released checkpoints.

    .venv/bin/python benchmarks/onnx_real_width.py [--runs 3] [--cases bert_base,qwen2_decode] [--quick]

Suite (superkernel.onnx.realsuite, seeded random weights, both exporters): BERT-base and
RoBERTa-base (sequence 128, 4 layers), DeBERTa-v2 (768 wide, disentangled attention, 6
layers), CLIP text (512 x 6, sequence 77), a Qwen2-0.5B-wide decode step (896, 14/2 heads,
vocab 151936, 4 layers, 127 past positions). The exports are made once and cached in
``--models`` (they are deterministic); each of ``--runs`` runs is a separate process that
fuses (GA calibrates afresh, its own calibration cache), checks accuracy and times P1 (ORT_ENABLE_ALL),
P2 (ORT transformers optimizer), P3 (onnxscript optimize_for_ort) and GA together
(benchmarks/onnx_autofusion.py's harness: warmed process, random session creation order,
interleaved paired rounds, 95 % intervals). Per case: ratios with intervals, which peer
fusions are slower than plain ORT, kinds, diffs, GA's time to fuse. Across runs: the
spread (min-max) of every ratio and of the geometric means, and the issue's criteria
(GA never > 1 % slower than P1; geomean GA/P1 <= 0.97; geomean GA/best peer <= 0.99).
Writes benchmarks/results/onnx_real_width.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import onnx_autofusion as OA  # noqa: E402 - the shared harness

from superkernel.onnx import realsuite  # noqa: E402
from superkernel.timing import rotation  # noqa: E402
from superkernel.util import atomic_write  # noqa: E402

EXPORTERS = ("legacy", "dynamo")


def selection(cases: str, exporters: str) -> tuple[list[str], list[str]]:
    """The comma-separated ``--cases`` and ``--exporters`` as lists; an unknown name exits naming the choices."""
    from superkernel.onnx import realsuite

    chosen = [c for c in cases.split(",") if c]
    unknown = sorted(set(chosen) - set(realsuite.CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(realsuite.CASES)}")
    tools = [e for e in exporters.split(",") if e]
    if set(tools) - set(EXPORTERS):
        raise SystemExit(f"unknown exporter in {exporters!r}: choose from {', '.join(EXPORTERS)}")
    return chosen, tools


def model_path(models: str, case: str, exporter: str) -> str:
    """The cached export of ``case`` (made now when missing)."""
    p = os.path.join(models, f"{case}_{exporter}.onnx")
    if not os.path.exists(p):
        os.makedirs(models, exist_ok=True)
        tmp = p + ".part.onnx"
        realsuite.export(case, exporter, tmp)
        os.replace(tmp, p)
    return p


BIG = {"qwen2_decode"}  # over 1 GB per session: parallel runs take turns (a file lock), memory is finite


def one_run(cases: list[str], exporters: list[str], models: str, repeat: int, warmup: int, max_seconds: float,
            out: str, calibration_cache: str = "", looks: int = 1) -> int:
    import contextlib
    import fcntl

    rows = []
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            for exp in exporters:
                t0, case_load0 = time.perf_counter(), os.getloadavg()[0]
                lock = open(os.path.join(models, ".big.lock"), "w") if case in BIG else None
                try:
                    if lock is not None:
                        fcntl.flock(lock, fcntl.LOCK_EX)
                    src = model_path(models, case, exp)
                    sh = realsuite.SHAPES[case]
                    row = OA.run_case(case, exp, tmp, repeat, warmup, src=src, p2=(sh.model_type, sh.heads, sh.hidden),
                                      seed=len(rows) + int(time.time()), max_seconds=max_seconds,
                                      calibration_cache=calibration_cache or None, looks=looks)
                except Exception as e:  # noqa: BLE001 - recorded, the suite goes on
                    traceback.print_exc()
                    row = {"case": f"{case}/{exp}", "family": case, "exporter": exp,
                           "error": f"{type(e).__name__}: {str(e)[:300]}"}
                finally:
                    if lock is not None:
                        with contextlib.suppress(OSError):
                            fcntl.flock(lock, fcntl.LOCK_UN)
                        lock.close()
                    shutil.rmtree(os.path.join(tmp, f"{case}_{exp}"), ignore_errors=True)  # GB per case
                row["case_seconds"] = time.perf_counter() - t0
                row["load"] = [round(case_load0, 2), round(os.getloadavg()[0], 2)]  # 1-min average, start / end
                rows.append(row)
                partial = {"load": [round(load0, 2), round(os.getloadavg()[0], 2)], "cases": rows, "complete": False}
                atomic_write(out, json.dumps(partial, indent=1, default=str))  # a stopped run keeps its cases
                print(f"{row['case']:<24} " + (f"GA/P1 {OA.ci(row, 'ga_vs_p1')}  GA/best {OA.ci(row, 'ga_vs_best_p2_p3')}"
                                               f"  rounds {row.get('rounds')}" if "error" not in row
                                               else f"ERROR {row['error']}"), flush=True)
    atomic_write(out, json.dumps({"load": [round(load0, 2), round(os.getloadavg()[0], 2)], "cases": rows,
                                  "complete": True}, indent=1, default=str))
    return 0


def run_env(hugepages: bool) -> dict:
    """The environment of a run process: this one's, plus glibc's huge-page tunable when asked."""
    env = dict(os.environ)
    if hugepages:
        env["GLIBC_TUNABLES"] = ":".join(x for x in (env.get("GLIBC_TUNABLES", ""), "glibc.malloc.hugetlb=1") if x)
    return env


def summarize(runs: list[dict]) -> dict:
    """Per case: each run's ratios; across runs: min / max; geometric means per run; criteria."""
    cases: dict[str, dict] = {}
    per_run = []
    for r in runs:
        ok = [c for c in r["cases"] if c.get("ga_vs_p1")]
        per_run.append({"geomean_ga_vs_p1": OA.geomean(c["ga_vs_p1"] for c in ok),
                        "geomean_ga_vs_best": OA.geomean(c.get("ga_vs_best_p2_p3") for c in ok),
                        "worst_ga_vs_p1": max((c["ga_vs_p1"] for c in ok), default=None), "load": r.get("load"),
                        "failed": [c["case"] for c in r["cases"] if not c.get("ga_vs_p1")],
                        "complete": r.get("complete", True), "cases_done": len(r["cases"])})
        for c in r["cases"]:
            e = cases.setdefault(c["case"], {"ga_vs_p1": [], "ga_vs_best": [], "p2_vs_p1": [], "p3_vs_p1": []})
            e["ga_vs_p1"].append(c.get("ga_vs_p1"))
            e["ga_vs_best"].append(c.get("ga_vs_best_p2_p3"))
            for t in ("P2", "P3"):
                e[f"{t.lower()}_vs_p1"].append(c.get("tools", {}).get(t, {}).get("vs_p1"))
    g1 = [p["geomean_ga_vs_p1"] for p in per_run if p["geomean_ga_vs_p1"]]
    gb = [p["geomean_ga_vs_best"] for p in per_run if p["geomean_ga_vs_best"]]
    worst = [p["worst_ga_vs_p1"] for p in per_run if p["worst_ga_vs_p1"]]
    crit = {"never_more_than_1pct_slower_than_p1": bool(worst) and max(worst) <= 1.01,
            "geomean_ga_vs_p1_le_0.97": bool(g1) and max(g1) <= 0.97,
            "geomean_ga_vs_best_le_0.99": bool(gb) and max(gb) <= 0.99,
            "all_cases_ran_in_every_run": all(not p["failed"] and p["complete"] for p in per_run)}
    return {"per_run": per_run, "cases": cases, "criteria": crit,
            "geomean_ga_vs_p1_range": [min(g1), max(g1)] if g1 else None,
            "geomean_ga_vs_best_range": [min(gb), max(gb)] if gb else None,
            "worst_ga_vs_p1": max(worst) if worst else None}


def _rng(xs) -> str:
    xs = [x for x in xs if x]
    if not xs:
        return "-"
    return f"{min(xs):.3f}-{max(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def markdown(result: dict) -> str:
    hw, s = result["hardware"], result["summary"]
    last = max(result["runs"], key=lambda r: len(r["cases"]))  # the run with the most cases
    L = ["# graph-autofusion at real width vs ONNX Runtime baselines", "",
         f"Hardware: {hw['cpu']}, {hw['cores']} cores, shared with other jobs; onnxruntime {hw['onnxruntime']}, "
         f"onnxscript {hw['onnxscript']}, torch {hw['torch']}, transformers {hw['transformers']}. "
         f"{len(result['runs'])} separate process runs"
         + (" (started at once, so they also competed with each other)" if result.get("parallel_runs")
            else " (one after another)")
         + "; 1-min load average at start / end of each: "
         + ", ".join(f"{p['load'][0]} / {p['load'][1]}" for p in s["per_run"] if p.get("load")) + ". "
         f"1 intra-op thread; per case up to {result['repeat']} interleaved rounds (stopped after "
         f"{result['max_seconds']:.0f} s, at least 20) after {result['warmup']} warm-up rounds; warmed process; "
         + ("random session creation order; ratios are medians of per-round paired ratios. "
            if result.get("looks", 1) <= 1 else
            f"the rounds split over up to {result['looks']} looks, each with fresh sessions created in its own random "
            "order; ratios are medians over looks of each look's median per-round paired ratio, intervals over looks "
            "(sign test; with up to 8 looks the range of the looks). ")
         + ("Every timing process ran with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (ONNX Runtime's buffers on "
            "transparent huge pages; every tool alike). " if result.get("malloc_hugepages") else "")
         + "P1 ORT_ENABLE_ALL on the original, "
         "P2 ORT transformers optimizer, P3 onnxscript optimize_for_ort, GA graph-autofusion ("
         + ("micro-benchmark calibration cache shared by the runs: the first run measured it, later runs reused its "
            "decisions" if result.get("shared_calibration") else "calibrated afresh per run")
         + "; end-to-end checked and verified in every run).", "",
         "## Across runs (min-max of the per-run medians)", "",
         "| case | GA/P1 | GA/best(P2,P3) | P2/P1 | P3/P1 |", "|---|---|---|---|---|"]
    for name, e in s["cases"].items():
        L.append(f"| {name} | {_rng(e['ga_vs_p1'])} | {_rng(e['ga_vs_best'])} | {_rng(e['p2_vs_p1'])} | "
                 f"{_rng(e['p3_vs_p1'])} |")
    L += ["", "| run | cases done | geomean GA/P1 | geomean GA/best | worst GA/P1 | failed |",
          "|---|---|---|---|---|---|"]
    for i, p in enumerate(s["per_run"]):
        L.append(f"| {i + 1} | {p['cases_done']}{'' if p['complete'] else ' (stopped)'} | "
                 f"{p['geomean_ga_vs_p1'] or 0:.3f} | {p['geomean_ga_vs_best'] or 0:.3f} | "
                 f"{p['worst_ga_vs_p1'] or 0:.3f} | {', '.join(p['failed']) or '-'} |")
    L += ["", "Criteria (issue 25, over all runs): " + "; ".join(
        f"{k}: {'yes' if v else 'NO'}" for k, v in s["criteria"].items()), "",
        "## One run in detail (the one with the most cases)", "",
        "| case | P1 ms | P2 ms | P3 ms | GA ms | GA/P1 [95 %] | GA/best [95 %] | peers slower than P1 | "
        "max abs diff P2 / P3 / GA | P2 kinds | P3 kinds | GA kinds | GA not kept (measured slower) | "
        "GA end-to-end | GA s to fuse | case s | load start/end | rounds | huge pages MB |", "|" + "---|" * 19]
    for r in last["cases"]:
        if "error" in r:
            L.append(f"| {r['case']} | error: {r['error']} |" + " |" * 17)
            continue
        t = r["tools"]

        def ms(k):
            v = t.get(k, {})
            return f"{v['median_ms']:.2f}" if "median_ms" in v else ("fail" if "error" in v else "-")

        def diff(k):
            v = t.get(k, {})
            return f"{v['max_abs_diff']:.1e}" + ("" if v.get("within_tolerance") else " (!)") if "max_abs_diff" in v \
                else "fail"

        ga = t.get("GA", {})
        e2e = ga.get("end_to_end") or {}
        slower = ", ".join(f"{p} {t[p]['vs_p1']:.3f} [{t[p]['vs_p1_ci'][0]:.3f}-{t[p]['vs_p1_ci'][1]:.3f}]"
                           for p in r.get("peers_slower_than_p1", []))
        e2e_s = (f"{e2e['ratio']:.3f} [{e2e.get('ratio_lo', 0):.3f}-{e2e.get('ratio_hi', 0):.3f}] {e2e.get('verdict', '')}"
                 + (f", dropped {', '.join(e2e['dropped_rules'])}" if e2e.get("dropped_rules") else "")
                 if "ratio" in e2e else ("error" if "error" in e2e else "-"))
        L.append(" | ".join([
            f"| {r['case']}", ms("P1"), ms("P2"), ms("P3"), ms("GA"), OA.ci(r, "ga_vs_p1"), OA.ci(r, "ga_vs_best_p2_p3"),
            slower or "-", f"{diff('P2')} / {diff('P3')} / {diff('GA')}",
            ", ".join(t.get("P2", {}).get("kinds", [])) or "-", ", ".join(t.get("P3", {}).get("kinds", [])) or "-",
            ", ".join(ga.get("kinds", [])) or "-", ", ".join(sorted({x for x, _ in ga.get("not_kept", [])})) or "-",
            e2e_s, f"{ga.get('seconds', 0):.0f}", f"{r.get('case_seconds', 0):.0f}",
            "/".join(str(x) for x in r.get("load", [])) or "-", str(r.get("rounds")),
            f"{r['anon_huge_pages_kb'] / 1024:.0f}" if r.get("anon_huge_pages_kb") is not None else "-"]) + " |")
    L += ["", "GA near misses in that run (pattern found, not fusable):", ""]
    for r in last["cases"]:
        nm = r.get("tools", {}).get("GA", {}).get("near_miss_rules")
        if nm:
            L.append(f"- {r['case']}: {', '.join(nm)}")
    L += ["", "Peers slower than plain ORT (interval above 1) are a point for users: their fusions can cost time.",
          "(!) = outside graph-autofusion's per-dtype tolerance against the original.", ""]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=60)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=90.0, help="time budget of one case's timing loop")
    p.add_argument("--quick", action="store_true", help="1 run, 20 rounds (smoke test)")
    p.add_argument("--parallel", action="store_true",
                   help="start the runs at once (separate processes; on a machine shared with other jobs this is "
                        "how they get CPU time; the report says so)")
    p.add_argument("--cases", default="")
    p.add_argument("--exporters", default=",".join(EXPORTERS))
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"),
                   help="where the exports are cached")
    p.add_argument("--out", default=OA.RESULTS)
    p.add_argument("--rotate", action="store_true", help="each run starts at another case (parallel runs then "
                   "meet different cases at a time)")
    p.add_argument("--runs-dir", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_runs"),
                   help="where each run writes its JSON (after every case)")
    p.add_argument("--aggregate", default="", metavar="RUNS_DIR",
                   help="only publish the figures of the run files in RUNS_DIR (e.g. of a stopped series)")
    p.add_argument("--shared-calibration", action="store_true",
                   help="GA's micro-benchmark cache is shared by the runs of the series (RUNS_DIR/calibration.json): "
                        "the first run calibrates, later runs reuse its decisions; each run's end-to-end check and "
                        "timing are its own (default: every run calibrates afresh)")
    p.add_argument("--looks", type=int, default=1,
                   help="split each case's rounds over this many looks, each with fresh sessions created in their "
                        "own random order; ratios and intervals are then over looks (a session of a ~1 GB model "
                        "keeps its speed for its lifetime, see onnx_real_width_decode.md)")
    p.add_argument("--malloc-hugepages", action="store_true",
                   help="run every timing process with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc >= 2.35 "
                        "madvises its large allocations for transparent huge pages; every tool alike)")
    p.add_argument("--name", default="onnx_real_width", help="base name of the JSON and markdown written to --out: a configuration's name, never a run's: its next run overwrites the file, git keeps the history")
    p.add_argument("--calibration-cache", default="", help=argparse.SUPPRESS)  # internal: to one run
    p.add_argument("--one-run", default="", help=argparse.SUPPRESS)  # internal: one run, JSON to this path
    a = p.parse_args(argv)
    cases, exporters = selection(a.cases or ",".join(realsuite.CASES), a.exporters)
    runs, repeat = (1, 20) if a.quick else (a.runs, a.repeat)
    if a.one_run:
        return one_run(cases, exporters, a.models, repeat, a.warmup, a.max_seconds, a.one_run, a.calibration_cache,
                       a.looks)
    import onnxruntime as ort
    import onnxscript
    import torch
    import transformers

    hw = {"cpu": OA.cpu_name(), "cores": os.cpu_count(), "onnxruntime": ort.__version__,
          "onnxscript": onnxscript.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    for c in cases if not a.aggregate else ():  # export once, before any run
        for e in exporters:
            model_path(a.models, c, e)
    results, t0 = [], time.perf_counter()
    if a.aggregate:  # figures from the run files of an earlier (possibly stopped) series
        for name in sorted(os.listdir(a.aggregate)):
            if name.startswith("run") and name.endswith(".json"):
                with open(os.path.join(a.aggregate, name), encoding="utf-8") as f:
                    results.append(json.load(f))
        write(a, hw, repeat, results, t0)
        return 0 if results else 1
    os.makedirs(a.runs_dir, exist_ok=True)
    for name in os.listdir(a.runs_dir):  # a new series: no stale run files
        if (name.startswith("run") and name.endswith(".json")) or name == "calibration.json":
            os.remove(os.path.join(a.runs_dir, name))
    tmp = a.runs_dir

    def launch(i: int):
        order = [cases[j] for j in rotation(len(cases), i)] if a.rotate else cases
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one-run",
                                 os.path.join(tmp, f"run{i}.json"), "--cases", ",".join(order),
                                 "--exporters", ",".join(exporters), "--models", a.models, "--repeat", str(repeat),
                                 "--warmup", str(a.warmup), "--max-seconds", str(a.max_seconds),
                                 "--looks", str(a.looks)]
                                + (["--calibration-cache", os.path.join(tmp, "calibration.json")]
                                   if a.shared_calibration else []), env=run_env(a.malloc_hugepages))

    def collect(i: int, proc) -> None:
        code, path = proc.wait(), os.path.join(tmp, f"run{i}.json")
        if code != 0 or not os.path.exists(path):
            print(f"run {i + 1} failed (exit {code})", file=sys.stderr)
            return
        with open(path, encoding="utf-8") as f:
            results.append(json.load(f))
        write(a, hw, repeat, results, t0)  # after every run: an interrupted series still leaves its figures

    if a.parallel:
        print(f"=== {runs} runs in parallel", flush=True)
        procs = [launch(i) for i in range(runs)]
        for i, proc in enumerate(procs):
            collect(i, proc)
    else:
        for i in range(runs):
            print(f"=== run {i + 1}/{runs}", flush=True)
            collect(i, launch(i))
    if not results:
        return 1
    s = summarize(results)
    print(json.dumps(s["criteria"]), json.dumps(s["per_run"], default=str))
    return 0 if all(not p["failed"] for p in s["per_run"]) else 1


def write(a, hw: dict, repeat: int, results: list[dict], t0: float) -> None:
    result = {"benchmark": a.name, "hardware": hw, "repeat": repeat, "warmup": a.warmup, "looks": a.looks,
              "malloc_hugepages": bool(a.malloc_hugepages),
              "parallel_runs": bool(a.parallel), "shared_calibration": bool(a.shared_calibration),
              "max_seconds": a.max_seconds, "threads": 1, "layers": realsuite.LAYERS, "seconds": time.perf_counter() - t0,
              "summary": summarize(results), "runs": results}
    os.makedirs(a.out, exist_ok=True)
    atomic_write(os.path.join(a.out, f"{a.name}.json"), json.dumps(result, indent=1, default=str))
    atomic_write(os.path.join(a.out, f"{a.name}.md"), markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
