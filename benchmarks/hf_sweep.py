"""Sweep ``superkernel optimize`` over many transformers decoder architectures.

    .venv/bin/python benchmarks/hf_sweep.py [--archs llama,mistral,...] [--quick] [--timeout 900]

Every architecture of :mod:`superkernel.tools.models.archs` (tiny configs: 2 layers,
hidden 64, vocabulary 256, seeded random weights, built on the fly, nothing downloaded)
is saved as a Hugging Face checkpoint (``save_pretrained``: config.json + safetensors)
and run through the command a user would run, each in its own process::

    superkernel optimize --model DIR --strategy all_layers --mode reduce-overhead \
        --steps 16 --warmup 3 --prompt-len 20 --output OUT --quiet

The prompt (20) is longer than the sliding windows (16), so sliding-window layers decode
with a full, rolling window. Per architecture the table shows the exit status, whether
every reduce-overhead plan was bit-identical to its exactness reference, Dynamo's
recompiles during the timed steps of every plan and baseline (measured, from
``results.json``), the recommendation (a plan, ``torch.compile``, ``eager`` or none) and
the recommended choice's speed against plain torch.compile.

Then, per architecture and in another fresh process, ``benchmarks/decode_latency.py`` times
eager, torch.compile and the reduce-overhead plan *interleaved* (rotating rounds, paired
ratios), which is what the "reduce-overhead vs eager" column reports: ``optimize`` times its
plans one after another, so on a shared machine its medians drift apart; the interleaved
ratio does not. ``--speed-only`` re-runs only that measurement, on the rows of an earlier
hf_sweep.json.

Writes benchmarks/results/hf_sweep.json and hf_sweep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _superkernel() -> list[str]:
    return [sys.executable, "-m", "superkernel.tools.cli"]


def build_checkpoint(name: str, directory: Path, seed: int = 0) -> None:
    code = ("import sys; from superkernel.tools.models.archs import save_checkpoint; "
            f"save_checkpoint({name!r}, sys.argv[1], seed={seed})")
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True, capture_output=True, timeout=300)


def run_arch(name: str, work: Path, args: argparse.Namespace) -> dict:
    ckpt, out = work / f"{name}_ckpt", work / f"{name}_out"
    row: dict = {"arch": name}
    start = time.perf_counter()
    try:
        build_checkpoint(name, ckpt)
    except subprocess.CalledProcessError as exc:
        row.update(exit=None, error=f"building the checkpoint failed: {exc.stderr.decode()[-300:]}")
        return row
    cmd = _superkernel() + ["optimize", "--model", str(ckpt), "--strategy", args.strategy, "--mode", args.mode,
                            "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompt-len",
                            str(args.prompt_len), "--output", str(out), "--quiet"]
    env = dict(os.environ, COLUMNS="240", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        row["exit"] = proc.returncode
        err = [line for line in proc.stderr.splitlines() if line.startswith("superkernel: ")]
        row["message"] = (err[-1] if err else (proc.stdout.strip().splitlines() or [""])[-1])[:400]
        tracebacks = "Traceback (most recent call last)" in proc.stderr
        row["traceback"] = tracebacks
    except subprocess.TimeoutExpired:
        row.update(exit="timeout", message=f"no result within {args.timeout}s")
    results = out / "results.json"
    if results.exists():
        data = json.loads(results.read_text())
        row.update(summarize(data))
    row.update(interleaved_speed(name, ckpt, work, args))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


#: What :func:`interleaved_speed` adds to a row.
SPEED_KEYS = ("ro_vs_eager", "ro_vs_torch_compile", "ro_cpu_vs_eager", "ro_interleaved_bit_exact", "speed_rounds",
              "speed_error")


def interleaved_speed(name: str, ckpt: Path, work: Path, args: argparse.Namespace) -> dict:
    """Reduce-overhead against eager and torch.compile, timed interleaved (decode_latency.py)."""
    out = work / f"{name}_latency"
    cmd = [sys.executable, str(HERE / "decode_latency.py"), "--model", str(ckpt), "--strategies", args.strategy,
           "--modes", "reduce-overhead", "--baselines", "eager,torch.compile", "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--prompt-len", str(args.prompt_len), "--rounds", str(args.rounds),
           "--output", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"speed_error": f"interleaved timing: no result within {args.timeout}s"}
    found = sorted(out.glob("decode_latency_*.json"))
    if proc.returncode not in (0, 1) or not found:
        return {"speed_error": f"interleaved timing failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    rows = json.loads(found[0].read_text())["rows"]
    ro = next((r for r in rows if r["plan"].endswith(" reduce-overhead")), None)
    if ro is None or "error" in ro:
        return {"speed_error": (ro or {}).get("error", "no reduce-overhead row")}
    return {"ro_vs_eager": ro.get("time_vs_eager"), "ro_vs_torch_compile": ro.get("time_vs_torch_compile"),
            "ro_cpu_vs_eager": ro.get("cpu_vs_eager"), "ro_interleaved_bit_exact": ro.get("bit_exact_vs_reference"),
            "speed_rounds": args.rounds}


def summarize(data: dict) -> dict:
    runs = data["results"]
    by = {r["name"]: r for r in runs}
    plans = [r for r in runs if r["kind"] == "plan"]
    ro = [r for r in plans if r["mode"] == "reduce-overhead"]
    rec = data.get("recommendation") or {}
    inductor = by.get("torch.compile")
    recommended = data.get("recommended")
    chosen = by.get(recommended) if recommended else None
    ratio = None
    if chosen is not None and inductor and inductor.get("decode_ms_median") and chosen.get("decode_ms_median"):
        ratio = inductor["decode_ms_median"] / chosen["decode_ms_median"]
    elif recommended == "eager" and inductor and inductor.get("decode_ms_median"):
        ratio = inductor["decode_ms_median"] / by["eager"]["decode_ms_median"]
    return {
        "dtype": data["settings"].get("dtype"),
        "dynamic_sources": data["settings"].get("dynamic_sources"),
        "ro_bit_exact": all(r["status"] == "passed" and r["vs_reference"]["identical"] for r in ro) if ro else None,
        "plans": {r["name"]: {"status": r["status"], "recompiles_timed": r.get("recompiles_timed"),
                              "segments": r["segments"], "cuts": len(r["cuts"]),
                              "decode_ms": r["decode_ms_median"], "error": r["error"]} for r in plans},
        "baselines": {r["name"]: {"recompiles_timed": r.get("recompiles_timed"), "decode_ms": r["decode_ms_median"],
                                  "error": r["error"]} for r in runs if r["kind"] == "baseline"},
        "recompiles_timed_max": max([r.get("recompiles_timed") or 0 for r in runs if r["name"] != "eager"] or [0]),
        "recommendation": rec.get("kind"),
        "recommended": recommended,
        "reason": rec.get("reason"),
        "ratio_vs_torch_compile": ratio,
        "eager_ms": by["eager"]["decode_ms_median"],
        "torch_compile_ms": inductor["decode_ms_median"] if inductor else None,
        "eager_drift": data.get("eager_drift"),
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# transformers architecture sweep: `superkernel optimize`", "",
             f"{meta['when']} on {meta['hardware']}; torch {meta['torch']}, transformers {meta['transformers']}.", "",
             f"Command per architecture: `superkernel optimize --model <tiny checkpoint> --strategy {meta['strategy']} "
             f"--mode {meta['mode']} --steps {meta['steps']} --warmup {meta['warmup']} --prompt-len "
             f"{meta['prompt_len']}` (tiny configs: 2 layers, hidden 64, vocabulary 256, random weights; sliding "
             "windows of 16 < prompt 20, so they roll). Recompiles: Dynamo guard failures during the timed steps, "
             "per plan and baseline (max over them). Ratio: torch.compile median / the recommended choice's median "
             "(1.00 = torch.compile itself); best plan: torch.compile median / the fastest passing superkernel plan's. "
             "Eager drift: eager timed again after all plans vs its first median; on a shared machine it is large, "
             "and the recommendation widens its noise threshold by it (a plan must beat torch.compile by more "
             "than max(3%, |drift|)), so read the timing columns as indicative only.", "",
             f"Reduce-overhead vs eager / vs torch.compile: time ratio of the {meta['strategy']} reduce-overhead plan, "
             f"timed interleaved with its baselines by decode_latency.py in its own process (median over "
             f"{meta.get('rounds', '-')} rotating rounds of paired ratios; below 1.00 is faster; timed "
             f"{meta.get('speed_when', meta['when'])}); CPU: the same with this thread's CPU time.", "",
             "| arch | tags | exit | reduce-overhead bit-exact | recompiles (timed, max) | recommendation | "
             "ratio vs torch.compile | best plan vs torch.compile | eager ms | torch.compile ms | eager drift | "
             "reduce-overhead vs eager (interleaved) | CPU | reduce-overhead vs torch.compile (interleaved) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bit = {True: "yes", False: "**no**", None: "-"}[r.get("ro_bit_exact")]
        rec = r.get("recommended") or r.get("recommendation") or "-"
        ratio = f"{r['ratio_vs_torch_compile']:.2f}" if r.get("ratio_vs_torch_compile") else "-"
        note = "" if r.get("exit") == 0 else (r.get("message") or r.get("error") or "")[:160].replace("|", "/")
        if r.get("dynamic_sources"):
            note = (note + " dynamic: " + r["dynamic_sources"].replace("\\", "")).strip()
        fmt = lambda v: f"{v:.3f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        plan_ms = [p["decode_ms"] for p in (r.get("plans") or {}).values()
                   if p.get("status") == "passed" and p.get("decode_ms")]
        best = (f"{r['torch_compile_ms'] / min(plan_ms):.2f}" if plan_ms and r.get("torch_compile_ms") else "-")
        drift = f"{r['eager_drift']:+.0%}" if isinstance(r.get("eager_drift"), (int, float)) else "-"
        if r.get("speed_error"):
            note = (note + " timing: " + r["speed_error"][:120].replace("|", "/")).strip()
        two = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        lines.append(f"| {r['arch']} | {', '.join(r.get('tags', []))} | {r.get('exit')} | {bit} | "
                     f"{r.get('recompiles_timed_max', '-')} | {rec} | {ratio} | {best} | {fmt(r.get('eager_ms'))} | "
                     f"{fmt(r.get('torch_compile_ms'))} | {drift} | {two(r.get('ro_vs_eager'))} | "
                     f"{two(r.get('ro_cpu_vs_eager'))} | {two(r.get('ro_vs_torch_compile'))} | {note} |")
    ok = sum(1 for r in rows if r.get("exit") == 0)
    lines += ["", f"{ok}/{len(rows)} architectures exit 0; "
              f"{sum(1 for r in rows if r.get('ro_bit_exact'))} bit-exact; "
              f"{sum(1 for r in rows if r.get('recompiles_timed_max') == 0)} with 0 recompiles in timed steps."]
    timed = [r for r in rows if isinstance(r.get("ro_vs_eager"), (int, float))]
    if timed:
        import math

        slower = [f"{r['arch']} {r['ro_vs_eager']:.2f}" for r in timed if r["ro_vs_eager"] > 1.0]
        geo = math.exp(sum(math.log(r["ro_vs_eager"]) for r in timed) / len(timed))
        lines.append(f"Reduce-overhead vs eager, interleaved: {len(timed)} timed, geometric mean {geo:.2f}, worst "
                     f"{max(r['ro_vs_eager'] for r in timed):.2f}; slower than eager: {', '.join(slower) or 'none'}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from superkernel.tools.models.archs import ARCHS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default=",".join(ARCHS), help="comma-separated names (default: all)")
    p.add_argument("--strategy", default="all_layers")
    p.add_argument("--mode", default="reduce-overhead")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=20)
    p.add_argument("--timeout", type=int, default=900, help="seconds per architecture")
    p.add_argument("--quick", action="store_true", help="a few archs and steps (smoke run, not for the table)")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (reduce-overhead vs eager)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only rewrite the markdown table from a hf_sweep.json")
    p.add_argument("--speed-only", type=Path, metavar="JSON",
                   help="only re-run the interleaved reduce-overhead vs eager timing on the rows of this hf_sweep.json")
    args = p.parse_args(argv)
    if args.render is not None:
        data = json.loads(args.render.read_text())
        write(data["rows"], data["meta"], args.output)
        return 0
    names = [n for n in args.archs.split(",") if n]
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        p.error(f"unknown arch(s) {', '.join(unknown)}; known: {', '.join(ARCHS)}")
    if args.quick:
        from superkernel.tools.models.archs import CI_SUBSET

        names = [n for n in names if n in CI_SUBSET] if args.archs == ",".join(ARCHS) else names
        args.steps, args.warmup = 6, 2
    import torch
    import transformers

    from superkernel.tools.advisor.environment import cpu_name

    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "hardware": f"{cpu_name()} "
            f"({platform.machine()}, {os.cpu_count()} logical cores)", "torch": torch.__version__,
            "transformers": transformers.__version__, "strategy": args.strategy, "mode": args.mode,
            "steps": args.steps, "warmup": args.warmup, "prompt_len": args.prompt_len, "rounds": args.rounds}
    if args.speed_only is not None:
        return speed_only(args.speed_only, names if args.archs != ",".join(ARCHS) else None, args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sk_sweep_") as tmp:
        for name in names:
            print(f"=== {name}", flush=True)
            row = run_arch(name, Path(tmp), args)
            row["tags"] = list(ARCHS[name].tags)
            rows.append(row)
            print(f"    exit {row.get('exit')}, bit-exact {row.get('ro_bit_exact')}, recompiles "
                  f"{row.get('recompiles_timed_max')}, recommended {row.get('recommended')} "
                  f"({row.get('seconds')} s) {row.get('message', '')[:200]}", flush=True)
            write(rows, meta, args.output)  # partial results survive an interrupted sweep
    write(rows, meta, args.output)
    print(f"results in {args.output / 'hf_sweep.md'}")
    return 0 if all(r.get("exit") == 0 for r in rows) else 1


def speed_only(previous: Path, names: list[str] | None, args: argparse.Namespace) -> int:
    """Refresh the interleaved reduce-overhead vs eager columns of an earlier sweep's rows."""
    data = json.loads(previous.read_text())
    rows, meta = data["rows"], data["meta"]
    meta.update(rounds=args.rounds, speed_when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    with tempfile.TemporaryDirectory(prefix="sk_sweep_") as tmp:
        for row in rows:
            if names is not None and row["arch"] not in names:
                continue
            ckpt = Path(tmp) / f"{row['arch']}_ckpt"
            build_checkpoint(row["arch"], ckpt)
            for key in SPEED_KEYS:  # an earlier run's figures never survive a failed re-run
                row.pop(key, None)
            row.update(interleaved_speed(row["arch"], ckpt, Path(tmp), args))
            print(f"=== {row['arch']}: reduce-overhead vs eager {row.get('ro_vs_eager')} "
                  f"{row.get('speed_error', '')}", flush=True)
            write(rows, meta, args.output)
    write(rows, meta, args.output)
    return 0 if all(isinstance(r.get("ro_vs_eager"), (int, float)) for r in rows) else 1


def write(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_sweep.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")
    (out / "hf_sweep.md").write_text(markdown(rows, meta))


if __name__ == "__main__":
    raise SystemExit(main())
