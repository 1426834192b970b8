"""Real-width decode on 4 KiB pages against transparent huge pages, one process per run.

    .venv/bin/python benchmarks/studies/real_width_hugepages.py [--processes 2] [--layers 24]
                                                       [--settings 4k,thp-torch,thp-glibc] [--aggregate-only]

A page setting holds for a whole process (PyTorch's ``THP_MEM_ALLOC_ENABLE`` is read at the first
allocation, glibc's tunable when the process starts), so every run of ``benchmarks/real_width.py``
(float32, 1 thread, max-autotune; eager and ``torch.compile`` in the same process, so every peer
and the bandwidth measurement behind the roofline run under the same setting) is a process of its
own, the settings alternating (A B C A B C ...). Settings:

- ``4k``: no switch (``SUPERKERNEL_HUGEPAGES=0``, so real_width.py leaves the allocator alone);
- ``thp-torch``: ``THP_MEM_ALLOC_ENABLE=1`` (c10's allocator madvises its 2 MB-aligned large blocks);
- ``thp-glibc``: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` only (malloc's large blocks).

Each run's JSON is kept in ``--work`` (``{layers}L_{setting}_{i}.json``); the summary
(step ms, x roofline, vs torch.compile, compile s, huge-page MB, correctness every round, per
setting and process) goes to benchmarks/results/real_width_hugepages{suffix}.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent  # benchmarks/: results/ and the scripts this study builds on
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH.parent / "src"))

from superkernel.util import atomic_write  # noqa: E402

SETTINGS = {"4k": {"SUPERKERNEL_HUGEPAGES": "0"},
            "thp-torch": {"THP_MEM_ALLOC_ENABLE": "1"},
            "thp-glibc": {"SUPERKERNEL_HUGEPAGES": "0", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}
CLEARED = ("THP_MEM_ALLOC_ENABLE", "GLIBC_TUNABLES", "SUPERKERNEL_HUGEPAGES")


def setting_env(setting: str, base: dict[str, str]) -> dict[str, str]:
    """``base`` without any page switch, plus the setting's own (nothing inherited decides the pages)."""
    env = {k: v for k, v in base.items() if k not in CLEARED}
    env.update(SETTINGS[setting])
    return env


def run_one(setting: str, index: int, args: argparse.Namespace) -> Path:
    env = setting_env(setting, dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(BENCH.parent / "src"), env.get("PYTHONPATH", "")) if x)
    name = f"{args.layers}L_{setting}_{index}"
    cmd = [sys.executable, str(BENCH / "real_width.py"), "--dtypes", "float32", "--threads", "1", "--modes",
           "max-autotune", "--layers", str(args.layers), "--output", str(args.work), "--name", name]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: load {os.getloadavg()[0]:.2f}", flush=True)
    with open(args.work / f"{name}.log", "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return args.work / f"{name}.json"


def summarize(files: list[Path]) -> dict[str, Any]:
    runs = []
    for path in files:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        stem = path.stem.split("_")
        for config in data["configs"]:
            rows = {r["peer"]: r for r in config["rows"]}
            plan = next((r for p, r in rows.items() if p.startswith("superkernel")), {})
            mem = config.get("memory_kb") or {}
            runs.append({"run": path.stem, "setting": stem[1], "layers": data["layers"], "pages": data.get("pages"),
                         "load": data["load"], "load_at_end": config.get("load_at_end"),
                         "transformers": data.get("transformers"), "torch": data["torch"],
                         "bandwidth_read_GBps": config["bandwidth_read_GBps"], "roofline_ms": config["roofline_ms"],
                         "regions_on_4k_MB": None if "large_regions_kb" not in config else
                         [round(x["rss_kb"] / 1024) for x in config["large_regions_kb"] if x["anon_huge_kb"] < x["rss_kb"] // 2],
                         "anon_MB": mem.get("anon_kb", 0) / 1024, "anon_huge_MB": mem.get("anon_huge_kb", 0) / 1024,
                         "peers": {p: {k: r.get(k) for k in ("median_ms", "x_roofline", "time_vs_torch_compile",
                                                             "time_vs_eager", "compile_s", "compile_cpu_s",
                                                             "check_summary", "correct_every_round",
                                                             "recompiles_timed", "error")}
                                   for p, r in rows.items()},
                         "plan": plan.get("peer")})
    return {"hardware": data["hardware"] if files and runs else None, "runs": runs, "per_setting": per_setting(runs)}


def _regions(sizes: list[int] | None) -> str:
    return "not recorded" if sizes is None else ", ".join(map(str, sizes)) or "none"


def markdown(summary: dict[str, Any], title: str) -> str:
    lines = [f"# {title}", "", f"Hardware: {summary['hardware']}. One process per run, settings alternating; "
             "float32, batch 1, 1 thread, 3 rotating rounds per run on fresh StaticCaches, every peer checked "
             "against eager on every round. Roofline = (weights + KV bytes) / read bandwidth measured in the same "
             "process (same page setting). Huge-page MB: AnonHugePages of the process with every peer alive "
             "(frozen/packed constants included).", "",
             "| run | setting | layers | load start / end | read GB/s | roofline ms | huge-page MB / anon MB | "
             "regions >= 64 MB on 4 KiB pages (MB) | "
             "eager ms | torch.compile ms (compile s) | max-autotune ms (compile s) | max-autotune x roofline | "
             "max-autotune vs torch.compile | correct every round |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        e, t, p = r["peers"].get("eager", {}), r["peers"].get("torch.compile", {}), r["peers"].get(r["plan"], {})
        f = lambda v, spec=".1f": format(v, spec) if isinstance(v, (int, float)) else "-"  # noqa: E731
        ok = ", ".join(f"{name.replace('superkernel decoder_layer ', '')}: {v.get('check_summary') or v.get('error')}"
                       for name, v in r["peers"].items())
        lines.append(f"| {r['run']} | {r['setting']} | {r['layers']} | {r['load']} / {r['load_at_end']} | "
                     f"{f(r['bandwidth_read_GBps'])} | {f(r['roofline_ms'])} | {r['anon_huge_MB']:.0f} / "
                     f"{r['anon_MB']:.0f} | {_regions(r.get('regions_on_4k_MB'))} | {f(e.get('median_ms'))} | {f(t.get('median_ms'))} "
                     f"({f(t.get('compile_s'), '.0f')}) | {f(p.get('median_ms'))} ({f(p.get('compile_s'), '.0f')}) | "
                     f"{f(p.get('x_roofline'), '.2f')} | {f(p.get('time_vs_torch_compile'), '.2f')} | {ok} |")
    lines += ["", "Per setting (median over its processes; ranges in brackets):", "",
              "| setting | processes | read GB/s | roofline ms | max-autotune ms | x roofline | vs torch.compile | "
              "torch.compile ms | eager ms | huge-page share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for setting, row in per_setting(summary["runs"]).items():
        cell = lambda k, spec=".1f": (f"{format(row[k][1], spec)} [{format(row[k][0], spec)}-"  # noqa: E731
                                      f"{format(row[k][2], spec)}]" if row.get(k) else "-")
        lines.append(f"| {setting} | {row['processes']} | {cell('read')} | {cell('roofline')} | {cell('plan')} | "
                     f"{cell('x_roofline', '.2f')} | {cell('vs_tc', '.2f')} | {cell('tc')} | {cell('eager')} | "
                     f"{cell('huge_share', '.0%')} |")
    return "\n".join(lines) + "\n"


def per_setting(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """(min, median, max) per setting of the figures the summary compares."""
    out: dict[str, dict[str, Any]] = {}
    for setting in dict.fromkeys(r["setting"] for r in runs):
        mine = [r for r in runs if r["setting"] == setting]
        figures = {"read": [r["bandwidth_read_GBps"] for r in mine], "roofline": [r["roofline_ms"] for r in mine],
                   "plan": [r["peers"][r["plan"]]["median_ms"] for r in mine if r["plan"]],
                   "x_roofline": [r["peers"][r["plan"]]["x_roofline"] for r in mine if r["plan"]],
                   "vs_tc": [r["peers"][r["plan"]]["time_vs_torch_compile"] for r in mine if r["plan"]],
                   "tc": [r["peers"]["torch.compile"]["median_ms"] for r in mine],
                   "eager": [r["peers"]["eager"]["median_ms"] for r in mine],
                   "huge_share": [r["anon_huge_MB"] / r["anon_MB"] for r in mine if r["anon_MB"]]}
        out[setting] = {"processes": len(mine), **{k: (min(v), statistics.median(v), max(v))
                                                   for k, v in figures.items() if v and None not in v}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="runs per setting")
    parser.add_argument("--first-index", type=int, default=1, help="index of the first process per setting")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--settings", default="4k,thp-torch,thp-glibc")
    parser.add_argument("--work", type=Path, default=Path("/tmp/real_width_hugepages"))
    parser.add_argument("--name", default="real_width_hugepages")
    parser.add_argument("--aggregate-only", action="store_true", help="summarize the runs already in --work")
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    if set(settings) - set(SETTINGS):
        parser.error(f"--settings: allowed {', '.join(SETTINGS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.aggregate_only:
        for i in range(args.first_index, args.first_index + args.processes):
            for s in settings:
                run_one(s, i, args)
    files = sorted(args.work.glob(f"{args.layers}L_*_*.json"), key=lambda p: (p.stem.split("_")[-1], p.stem))
    summary = summarize(files)
    title = f"Real-width decode (Qwen2-0.5B-shaped, {args.layers} layers, float32) on 4 KiB vs transparent huge pages"
    atomic_write(RESULTS / f"{args.name}.json", json.dumps(summary, indent=2) + "\n")
    atomic_write(RESULTS / f"{args.name}.md", markdown(summary, title))
    print(markdown(summary, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
