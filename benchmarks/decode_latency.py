"""Decode-step latency of the superkernel backend against its baselines, in one run.

    .venv/bin/python benchmarks/decode_latency.py [--model llama-tiny] [--steps 64] [--warmup 8]

Plans, all fed the same tokens from the same prompt and cache state (decode harness):
eager (uncompiled), torch.compile (default TorchInductor), on CUDA also
torch.compile(mode="reduce-overhead"), and superkernel in both modes with one scope
per decoder layer and one scope around the layer stack. Each plan is timed in rounds
alternating with eager, so "vs eager" (the median of per-round ratios) is immune to
machine drift. Prints median/p90 step time, ratios against eager and plain
torch.compile, the reduce-overhead exactness check
against the reference, and the achieved fraction of the memory roofline
(bytes of weights + KV cache read per step / measured copy bandwidth).
Writes benchmarks/results/decode_latency_<model>_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import superkernel as sk
from superkernel.tools.advisor.environment import choose_threads
from superkernel.tools.advisor.environment import hardware as describe_hardware
from superkernel.tools.advisor.compiling import compile_inductor, compile_superkernel
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.decode import prepare, run_decode, synchronize
from superkernel.util import atomic_write
from superkernel.tools.models import load_model

RESULTS = Path(__file__).resolve().parent / "results"


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large device-to-device copy (read + write), the best of a few."""
    n = megabytes * 2**20 // 4
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def bytes_per_step(model: torch.nn.Module, session) -> int:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(t.numel() * t.element_size() for layer in session.cache.layers for t in (layer.keys, layer.values))
    return weights + kv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds per plan, each an eager run then a plan run; medians over rounds are reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: 1 on CPU for tiny models, which keeps timings steady on a shared box)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    loaded = load_model(args.model, device=device)
    model = loaded.model
    choose_threads(args.threads, device, loaded.num_parameters)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, device=device)
    structure = analyze_structure(model)

    plans: list[tuple[str, str | None, str | None]] = [("torch.compile", None, None)]
    if device.type == "cuda":
        plans.append(("torch.compile reduce-overhead", None, None))
    for strategy in ("decoder_layer", "all_layers"):
        for mode in ("reduce-overhead", "max-autotune"):
            plans.append((f"superkernel {strategy} {mode}", strategy, mode))

    # Each plan is timed in rounds that alternate with eager (eager, plan, eager, plan, ...),
    # so machine drift cancels out of the plan-vs-eager ratio (median over rounds).
    eager_step = session.step_fn()
    eager_first = run_decode(session, eager_step, label="eager")
    eager_medians, eager_p90s = [], []
    rows, logits = [], {"eager": eager_first.logits}
    for label, strategy, mode in plans:
        sk.remove_scopes(model)
        if strategy is not None:
            sk.apply_scopes(model, plan_for(strategy, structure).scopes)
        if strategy is None:
            step = compile_inductor(session, "reduce-overhead" if "reduce-overhead" in label else None)
        else:
            step = compile_superkernel(session, mode)[0]
        first = run_decode(session, step, label=label)  # compiles on its first step
        medians, p90s, ratios = [], [], []
        for _ in range(args.repeats):
            eager = run_decode(session, eager_step, label="eager")
            run = run_decode(session, step, label=label)
            eager_medians.append(eager.median_ms)
            eager_p90s.append(eager.p90_ms)
            medians.append(run.median_ms)
            p90s.append(run.p90_ms)
            ratios.append(eager.median_ms / run.median_ms)
        row = {"plan": label, "median_ms": statistics.median(medians), "p90_ms": statistics.median(p90s),
               "speedup_vs_eager": statistics.median(ratios), "compile_s": first.compile_seconds}
        if mode == "reduce-overhead":
            ref_step, _ = compile_superkernel(session, mode, run_eagerly=True)
            ref = run_decode(session, ref_step, label="reference")
            row["bit_exact_vs_reference"] = bool(torch.equal(first.logits, ref.logits))
        logits[label] = first.logits
        rows.append(row)
        print(f"{label:<44} median {row['median_ms']:.3f} ms  p90 {row['p90_ms']:.3f} ms  "
              f"{row['speedup_vs_eager']:.3f}x vs eager (interleaved)", flush=True)
    sk.remove_scopes(model)
    rows.insert(0, {"plan": "eager", "median_ms": statistics.median(eager_medians), "p90_ms": statistics.median(eager_p90s),
                    "speedup_vs_eager": 1.0, "compile_s": 0.0})

    inductor_ms = rows[1]["median_ms"]
    bandwidth = copy_bandwidth(device)
    roofline_ms = bytes_per_step(model, session) / bandwidth * 1e3
    for row in rows:
        row["speedup_vs_torch_compile"] = inductor_ms / row["median_ms"]
        row["roofline_fraction"] = roofline_ms / row["median_ms"]
        row["max_abs_diff_vs_eager"] = float((logits[row["plan"]] - logits["eager"]).abs().max())

    hardware = describe_hardware(device)
    result = {"model": args.model, "device": str(device), "hardware": hardware, "torch": torch.__version__,
              "python": sys.version.split()[0], "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "copy_bandwidth_GBps": bandwidth / 1e9, "roofline_ms": roofline_ms, "rows": rows}
    lines = [f"# Decode-step latency: {args.model} on {hardware}", "",
             f"torch {torch.__version__}; {args.steps} timed steps after {args.warmup} warm-up; {args.repeats} rounds per plan, "
             "each an eager run then a plan run (\"vs eager\" is the median of the per-round ratios); "
             f"roofline {roofline_ms:.3f} ms at {bandwidth / 1e9:.1f} GB/s measured copy bandwidth.", "",
             "| plan | median ms | p90 ms | vs eager | vs torch.compile | roofline fraction | max abs diff vs eager | bit-exact vs reference | compile s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        exact = {True: "yes", False: "NO"}.get(r.get("bit_exact_vs_reference"), "-")
        lines.append(f"| {r['plan']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | {r['speedup_vs_eager']:.2f}x | "
                     f"{r['speedup_vs_torch_compile']:.2f}x | {r['roofline_fraction']:.1%} | {r['max_abs_diff_vs_eager']:.2e} | "
                     f"{exact} | {r['compile_s']:.1f} |")
    RESULTS.mkdir(exist_ok=True)
    stem = f"decode_latency_{args.model}_{device.type}"
    atomic_write(RESULTS / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    atomic_write(RESULTS / f"{stem}.md", "\n".join(lines) + "\n")
    if any(r["roofline_fraction"] > 1 for r in rows):
        lines += ["", "Roofline fractions above 100 % mean the weights and cache stay in the CPU caches, which are "
                  "faster than the DRAM copy bandwidth the roofline uses."]
    print("\n".join(lines))
    failed = [r["plan"] for r in rows if r.get("bit_exact_vs_reference") is False]
    if failed:
        print(f"reduce-overhead not bit-exact: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
