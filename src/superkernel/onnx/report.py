"""The run log as data (JSON) and as a Markdown report (``--report PATH.md`` + ``PATH.json``)."""

from __future__ import annotations

import os
from typing import Any

from .bench import BenchResult
from .engine import FusionResult
from .verify import VerifyResult


def json_twin(md_path: str) -> str:
    root, ext = os.path.splitext(md_path)
    return (root if ext.lower() in (".md", ".markdown") else md_path) + ".json"


def build(*, input_path: str, output_path: str | None, opset: int, opt_level: int, rules: list[str],
          dims: dict[str, int], fusion: FusionResult | None, verification: VerifyResult | None,
          benchmark: BenchResult | None, status: str, exit_code: int, written: list[str],
          cost_model: dict[str, Any], message: str = "", calibration: dict | None = None,
          e2e: dict | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "tool": "graph-autofusion", "status": status, "exit_code": exit_code, "message": message,
        "input": input_path, "output": output_path, "written": written, "opset": opset, "opt_level": opt_level,
        "rules": rules, "dims": dims, "cost_model": cost_model, "calibration": calibration,
        "end_to_end": e2e,
    }
    if fusion is not None:
        d.update(
            operators_found=fusion.ops_before, operators_after=fusion.ops_after,
            nodes_before=fusion.nodes_before, nodes_after=fusion.nodes_after,
            candidates=len(fusion.candidates), applied=[c.to_dict() for c in fusion.applied],
            skipped=[c.to_dict() for c in fusion.skipped], near_misses=[m.to_dict() for m in fusion.near_misses],
            estimated_bytes_saved=fusion.bytes_saved, node_count_saved=fusion.nodes_before - fusion.nodes_after,
            estimated_net_us=fusion.net_us, unfixed_dims=fusion.unfixed_dims,
            measured_saved_us=sum(c.measured.saved_us for c in fusion.applied if c.measured is not None),
            shape_inference=fusion.shape_inference.to_dict() if fusion.shape_inference else None,
        )
    d["verification"] = verification.to_dict() if verification else None
    d["benchmark"] = benchmark.to_dict() if benchmark else None
    return d


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    return out


def markdown(d: dict[str, Any]) -> str:
    L = [f"# graph-autofusion report: {os.path.basename(d['input'])}", ""]
    L += [f"- status: **{d['status']}** (exit code {d['exit_code']}){' - ' + d['message'] if d['message'] else ''}",
          f"- input: `{d['input']}` (opset {d['opset']})", f"- output: `{d['output']}`",
          f"- written: {', '.join('`%s`' % w for w in d['written']) or 'nothing'}",
          f"- opt level {d['opt_level']}, rules: {', '.join(d['rules']) or 'none'}",
          f"- dims: {d['dims'] or 'none fixed'}", ""]
    if "operators_found" in d:
        L += ["## Log", "",
              "```",
              "[INFO] Graph-autofusion started...",
              f"[INFO] Found {d['nodes_before']} operators, {d['candidates']} fusion candidates.",
              f"[INFO] Estimated benefit: {d['estimated_bytes_saved']} bytes of intermediate traffic saved, "
              f"{d['node_count_saved']} nodes saved, {d['estimated_net_us']:.2f} us net per call (cost model "
              f"{d['cost_model'].get('name')}).",
              f"[INFO] Fused {sum(len(c['nodes']) for c in d['applied'])} operators into {len(d['applied'])} "
              f"fused operators; {d['nodes_before']} -> {d['nodes_after']} nodes.",
              "[INFO] Fusion completed.", "```", ""]
        if d.get("unfixed_dims"):
            L += [f"Symbolic dims not fixed with --dim (1 in the estimate): {', '.join(d['unfixed_dims'])}", ""]
        L += ["## Operators found", ""]
        L += _table(["op", "before", "after"], [[k, v, d["operators_after"].get(k, 0)]
                                                 for k, v in d["operators_found"].items()]
                    + [[k, 0, v] for k, v in d["operators_after"].items() if k not in d["operators_found"]])
        si = d.get("shape_inference")
        if si:
            L += ["", f"Shape inference (matching only, not written): {si['onnx_inferred']} values typed by ONNX "
                      f"inference, {si['symbolic_inferred']} by symbolic inference, {si['still_unknown']} unknown"
                      + (f"; {'; '.join(si['notes'])}" if si["notes"] else "")]
        L += ["", "## Fusions applied", ""]

        def meas(c, key):
            m = c.get("measured")
            return f"{m[key]:.2f}" if m else "-"

        L += _table(["rule", "fused op", "root", "nodes", "bytes saved", "ops saved", "predicted net us",
                     "measured unfused us", "measured fused us", "measured saved us"],
                    [[c["rule"], c["fused_op"], c["root"], len(c["nodes"]), c["benefit"]["bytes_saved"],
                      c["benefit"]["launches_saved"], f"{c['benefit']['net_us']:+.3f}", meas(c, "unfused_us"),
                      meas(c, "fused_us"), meas(c, "saved_us")] for c in d["applied"]])
        cal = d.get("calibration")
        L += ["", ("Calibration: micro-benchmarks in ONNX Runtime (ORT_ENABLE_ALL) at the model's shapes, "
                   f"{cal['measured']} measured, {cal['reused_from_cache']} from the cache `{cal['cache']}` "
                   f"({cal['env']}); a fusion is kept when measured faster.") if cal
              else "Calibration: off (--no-calibrate); the estimate decides."]
        e = d.get("end_to_end")
        if e and "error" in e:
            L += ["", "## End-to-end check (ORT_ENABLE_ALL, this run)", "", f"failed: {e['error']}"]
        elif e:
            L += ["", "## End-to-end check (ORT_ENABLE_ALL, this run)", "",
                  f"original {e['original_ms']:.4f} ms, fused {e['fused_ms']:.4f} ms, ratio {e['ratio']:.3f} "
                  + (f"({int(e['confidence'] * 100)} % interval {e['ratio_lo']:.3f}-{e['ratio_hi']:.3f}, "
                     f"{e['rounds']} paired rounds: {e['verdict']}) " if "ratio_lo" in e else "")
                  + ("(three looks disagreed: median of their ratios, envelope of their intervals, majority "
                     "verdict) " if e.get("looks_disagreed") else "")
                  + f"(tolerance {e['tolerance']:.0%}); dropped rules: {', '.join(e['dropped_rules']) or 'none'}"
                  + (f". {e['stopped']}" if e.get("stopped") else "")
                  + (f". Timed in {e['timed_in']}" if e.get("timed_in") else "")
                  + (f" ({e['anon_huge_pages_kb']} kB on huge pages)" if e.get("anon_huge_pages_kb") is not None else "")
                  + (f". {e['note']}" if e.get("note") else ""), ""]
            L += _table(["step", "rules left out", "A ms", "B ms", "ratio B/A", "interval", "rounds", "verdict"],
                        [_e2e_row(st) for st in e["steps"]])
        L += ["", "## Candidates skipped", ""]
        L += _table(["rule", "root", "reason"], [[c["rule"], c["root"], c["reason"]] for c in d["skipped"]]) \
            if d["skipped"] else ["none"]
        L += ["", "## Near misses (pattern found, not fusable)", ""]
        L += _table(["rule", "node", "op", "reason"], [[m["rule"], m["node"], m["op"], m["reason"]]
                                                       for m in d["near_misses"]]) if d["near_misses"] else ["none"]
    v = d.get("verification")
    L += ["", "## Verification", ""]
    if v is None:
        L += ["not run (--no-verify or nothing to verify)"]
    else:
        L += [f"{'passed' if v['ok'] else 'FAILED'} (seed {v['seed']}, inputs {v['inputs']}; ORT_DISABLE_ALL for both)", ""]
        floors = any(o.get("quantization_floor") is not None for o in v["outputs"])
        L += _table(["output", "dtype", "shape", "max abs diff", "atol", "rtol", *(["quantization floor"] if floors
                                                                                 else []), "ok"],
                    [[o["name"], o["dtype"], o["shape"], f"{o['max_abs_diff']:.3g}", o["atol"], o["rtol"],
                      *([f"{o['quantization_floor']:.3g}" if o.get("quantization_floor") is not None else "-"]
                        if floors else []), "yes" if o["ok"] else "NO"] for o in v["outputs"]])
        if v.get("quantization_floor"):
            L += ["", f"Quantization floor: {v['quantization_floor']} (docs/graph_autofusion.md, "
                      "\"Quantized models\")."]
    b = d.get("benchmark")
    L += ["", "## Benchmark (ONNX Runtime CPU)", ""]
    if b is None:
        L += ["not run (pass --benchmark)"]
    else:
        L += _table(["model", "optimization", "median ms", "p90 ms", "runs"],
                    [[t["model"], t["level"], f"{t['median_ms']:.4f}", f"{t['p90_ms']:.4f}", t["runs"]]
                     for t in b["timings"]])
        L += ["", f"- speedup of fused over original with ORT_ENABLE_ALL: **{b['speedup_vs_ort_enable_all']:.3f}x**",
              f"- speedup of fused over original with ORT_DISABLE_ALL: {b['speedup_vs_ort_disable_all']:.3f}x"]
    return "\n".join(L) + "\n"


def _e2e_row(st: dict) -> list[str]:
    """One step of the end-to-end check: A is the original, or the current fused model in a
    head-to-head comparison."""
    h2h = "head_to_head" in st
    kind = ("head to head (A current fused, B leave-one-out)" if h2h else "chosen" if st.get("chosen")
            else "tried" if st.get("tried") else "confirm" if st.get("confirm")
            else "tie-break (the first two looks disagreed)" if st.get("tiebreak") else "first")
    a, b = (st.get("a_ms"), st.get("b_ms")) if h2h or "a_ms" in st else (st.get("original_ms"), st.get("fused_ms"))
    lo, hi = st.get("lo"), st.get("hi")
    return [kind, ", ".join(st["head_to_head"] if h2h else st.get("excluded", [])) or "none",
            f"{a:.4f}" if a is not None else "-", f"{b:.4f}" if b is not None else "-", f"{st['ratio']:.3f}",
            f"{lo:.3f}-{hi:.3f}" if lo is not None else "-", str(st.get("rounds", "-")), st.get("verdict", "-")]
