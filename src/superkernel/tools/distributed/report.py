"""Rank 0's report of a tensor-parallel ``optimize``: markdown, results.json and superkernel.yaml.

Written only after every rank finished measuring; each file atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from superkernel.tools.advisor.optimize_report import PLAN_NAME, REPORT_NAME
from superkernel.tools.advisor.plan_file import PlanFile, write_plan
from superkernel.tools.distributed.timing import job_step_ms
from superkernel.util import atomic_write

RESULTS_NAME = "results.json"


def _median_ms(seconds: list[float], warmup: int) -> float | None:
    timed = sorted(seconds[warmup:])
    if not timed:
        return None
    mid = len(timed) // 2
    return (timed[mid] if len(timed) % 2 else (timed[mid - 1] + timed[mid]) / 2) * 1e3


def rows(gathered: list[dict], single: dict, warmup: int) -> list[dict[str, Any]]:
    """One row per run: job time, per-rank times, precision on every rank, ratios."""
    singles = {r["name"]: r for r in single["runs"]}
    one_eager = singles.get("eager", {}).get("median_ms")
    out = []
    names = [r["name"] for r in gathered[0]["runs"]]
    tp_eager = None
    for name in names:
        per_rank = [next(r for r in g["runs"] if r["name"] == name) for g in gathered]
        first = per_rank[0]
        row = {"name": name, "kind": first["kind"], "strategy": first["strategy"], "mode": first["mode"],
               "error": next((r["error"] for r in per_rank if r["error"]), None)}
        if not row["error"]:
            row["job_ms"] = job_step_ms([r["step_seconds"] for r in per_rank], warmup)
            row["rank_ms"] = [_median_ms(r["step_seconds"], warmup) for r in per_rank]
            row["compile_s"] = max(r["compile_s"] or 0.0 for r in per_rank)
            row["segments"] = first["segments"]
            row["cuts"] = first["cuts"]
            row["passed_every_rank"] = all(r["passed"] for r in per_rank)
            row["bit_exact_every_rank"] = (all(r["bit_exact"] for r in per_rank) if first["bit_exact"] is not None
                                           else None)
            row["precision"] = [r["reason"] for r in per_rank]
            row["vs_single_max_abs"] = max(r["vs_single_max_abs"] for r in per_rank)
            row["recompiles_timed"] = [r.get("recompiles_timed") for r in per_rank]
            if name == "eager":
                tp_eager = row["job_ms"]
            row["speedup_vs_tp_eager"] = tp_eager / row["job_ms"] if tp_eager and row["job_ms"] else None
            one = singles.get(name, {}).get("median_ms")
            row["single_process_ms"] = one
            row["speedup_vs_single_same_run"] = one / row["job_ms"] if one and row["job_ms"] else None
            row["speedup_vs_single_eager"] = one_eager / row["job_ms"] if one_eager and row["job_ms"] else None
        out.append(row)
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def render(opts, job, single: dict, table: list[dict], shares: list[dict], best: str | None,
           plan_used: dict[str, str], sharded, versions: dict, hardware: str) -> str:
    o = opts.base
    world = job.world_size
    lines = [f"# superkernel optimize — {o.model}, tensor parallel over {world} ranks", "",
             f"- job: {world} ranks ({job.backend}), {single['threads_per_rank']} torch thread(s) per rank; "
             f"single-process reference on the same cores: {single['threads']} thread(s)",
             f"- hardware: {hardware}",
             f"- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
             f"- tensor-parallel plan: {opts.tp_plan_source}, {len(plan_used)} rule(s), "
             f"{len(sharded.applied)} module(s)/parameter(s) sharded, {sharded.collectives} collective hook(s)"
             + (f"; rules naming nothing in this model (skipped): {', '.join(sharded.unmatched)}"
                if sharded.unmatched else ""),
             f"- decode: prompt {o.prompt_len} tokens, {o.warmup} warm-up + {o.steps} timed steps, batch {o.batch_size}; "
             "every step starts after a barrier; a step's job time is the slowest rank's",
             "", "## Results", "",
             "| run | job ms/step | " + " | ".join(f"rank {r} ms" for r in range(world))
             + " | compile s | segments | recompiles (timed, per rank) | precision (every rank) | vs TP eager | "
               "1-process same run ms | vs 1-process same run | vs 1-process eager |",
             "|---|---:|" + "---:|" * world + "---:|---:|---:|---|---:|---:|---:|---:|"]
    for row in table:
        if row["error"]:
            lines.append(f"| {row['name']} | error | " + " | ".join("—" for _ in range(world))
                         + f" | — | — | — | {row['error'][:160]} | — | — | — | — |")
            continue
        verdict = "passed" if row["passed_every_rank"] else "FAILED"
        if row["bit_exact_every_rank"]:
            verdict += ", bit-exact"
        mark = " **(recommended)**" if row["name"] == best else ""
        lines.append(f"| {row['name']}{mark} | {_fmt(row['job_ms'])} | "
                     + " | ".join(_fmt(v) for v in row["rank_ms"])
                     + f" | {_fmt(row['compile_s'], '.1f')} | {_fmt(row['segments'], 'd')} | "
                       f"{' / '.join('—' if n is None else str(n) for n in row['recompiles_timed'])} | {verdict} | "
                       f"{_fmt(row['speedup_vs_tp_eager'], '.2f')}x | {_fmt(row['single_process_ms'])} | "
                       f"{_fmt(row['speedup_vs_single_same_run'], '.2f')}x | "
                       f"{_fmt(row['speedup_vs_single_eager'], '.2f')}x |")
    lines += ["", "Precision: reduce-overhead must be bit-identical to each rank's exactness reference "
              "(the captured graph run op by op), and every run must stay within "
              f"{o.tolerance:g} x the logit scale of the single-process reference (the unsharded model, uncompiled): "
              "a sharded matmul sums in another order, so bit equality with one process is not expected.", "",
              "Recompiles: Dynamo's recompiles during each rank's timed steps (`torch._dynamo.utils.guard_failures`); "
              "a plan that recompiles there on any rank fails.", ""]
    for row in table:
        if not row["error"] and row["kind"] == "plan":
            lines.append(f"- {row['name']}: " + "; ".join(f"rank {i}: {p}" for i, p in enumerate(row["precision"])))
            if row["cuts"]:
                lines.append(f"  - cuts: {'; '.join(row['cuts'][:5])}")
    lines += ["", "## Single-process run (same cores)", "", "| run | ms/step | compile s | precision |",
              "|---|---:|---:|---|"]
    for r in single["runs"]:
        status = "error" if r.get("error") else ("—" if r["passed"] is None else ("passed" if r["passed"] else "FAILED"))
        lines.append(f"| {r['name']} | {_fmt(r['median_ms'])} | {_fmt(r['compile_s'], '.1f')} | {status} |")
    lines += ["", "## Collectives' share of the step (torch.profiler)", "",
              "| run | " + " | ".join(f"rank {r}" for r in range(world)) + " |", "|---|" + "---:|" * world]
    for name in shares[0]:
        cells = [f"{s[name]['share']:.0%} ({s[name]['collective_ms_per_step']:.3f} of {s[name]['step_ms']:.3f} ms)"
                 if s.get(name) and s[name]["share"] is not None else "—" for s in shares]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Self CPU time of the collective events (all-reduce, all-gather, their waits) over the wall "
              "time of the profiled steps, per rank.", "", "## Recommendation", ""]
    if best:
        row = next(r for r in table if r["name"] == best)
        lines.append(f"{best}: {row['job_ms']:.3f} ms/step on {world} ranks, {row['speedup_vs_tp_eager']:.2f}x vs "
                     f"tensor-parallel eager, {_fmt(row['speedup_vs_single_same_run'], '.2f')}x vs the same plan in "
                     f"one process on the same cores. Passed precision on every rank.")
    else:
        lines.append("No plan passed precision on every rank.")
    return "\n".join(lines) + "\n"


def write_report(opts, job, single: dict, gathered: list[dict], shares: list[dict], best: str | None,
                 plan_used: dict[str, str], sharded, versions: dict, hardware: str) -> dict[str, Path]:
    o = opts.base
    out = Path(o.output)
    inputs = list(o.inputs)
    table = rows(gathered, single, o.warmup)
    files: dict[str, Path] = {}
    if best is not None:
        row = next(r for r in table if r["name"] == best)
        scopes = next(p["scopes"] for p in single["plans"] if p["strategy"] == row["strategy"])
        measured = {"decode_ms_median": round(row["job_ms"], 4), "tensor_parallel": {
            "world_size": job.world_size, "backend": job.backend, "plan": opts.tp_plan_source},
            "speedup_vs_tp_eager": round(row["speedup_vs_tp_eager"] or 0, 3), "hardware": hardware}
        files["plan"] = write_plan(out / PLAN_NAME, PlanFile(scopes=scopes, mode=row["mode"], options=o.options,
                                                             model=o.model, strategy=row["strategy"],
                                                             measured=measured), inputs)
    payload = {"model": o.model, "strategy": o.strategy, "search": o.search, "world_size": job.world_size, "backend": job.backend, "hardware": hardware,
               "versions": versions, "tp_plan": plan_used, "tp_plan_source": opts.tp_plan_source,
               "sharded": sharded.applied, "tp_plan_unmatched": sharded.unmatched, "recommended": best, "single_process": single, "results": table,
               "per_rank": gathered, "collective_share": shares}
    files["results"] = atomic_write(out / RESULTS_NAME, json.dumps(payload, indent=2, default=str) + "\n", inputs)
    files["report"] = atomic_write(out / REPORT_NAME, render(opts, job, single, table, shares, best, plan_used,
                                                             sharded, versions, hardware), inputs)
    return files
