"""A/B of ``inductor.gemm_timing`` on the real-width decode step: GEMM choices timed cache-hot vs from memory.

    .venv/bin/python benchmarks/studies/real_width_gemm_timing.py [--layers 24] [--threads 1] [--rounds 5]

benchmarks/real_width.py's Qwen2-0.5B-shaped model (float32, seeded random weights), one scope per
decoder layer, compiled with superkernel ``max-autotune`` twice in one process (cold Inductor cache dir):
``inductor.gemm_timing = "cache"`` (Inductor's own repeated calls: the weights sit in the last-level cache)
and ``"memory"`` (every timed call after evicting the caches, as a decode step reads its weights:
:mod:`superkernel.runtime.inductor.gemm_timing`). Both steps are then timed in alternating rounds on the same
cache state; each round's logits are compared with eager's. Compile time (wall, CPU) beside each.
Writes benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from superkernel import hugepages

PAGES = hugepages.enable_for_this_process()  # before torch's first allocation; SUPERKERNEL_HUGEPAGES=0: 4 KiB pages

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import superkernel as sk  # noqa: E402
from superkernel.timing import rotation  # noqa: E402
from real_width import RESULTS, build_model, cpu_seconds, memory_bandwidth  # noqa: E402
from superkernel.tools.advisor.compiling import own_code  # noqa: E402
from superkernel.tools.advisor.environment import hardware as describe_hardware  # noqa: E402
from superkernel.tools.advisor.strategies import plan_for  # noqa: E402
from superkernel.tools.advisor.structure import analyze_structure  # noqa: E402
from superkernel.tools.decode import prepare, run_decode  # noqa: E402
from superkernel.util import atomic_write  # noqa: E402

TIMINGS = ("memory", "cache")  # compiled in this order: the second reuses the first's C++ builds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="real_width_gemm_timing")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cold = tempfile.TemporaryDirectory(prefix="real_width_gemm_timing_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold.name
    torch.set_num_threads(args.threads)
    import transformers

    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    model = build_model(args.layers, torch.float32, args.seed)
    session = prepare(model, prompt_len=32, steps=args.steps, warmup=args.warmup, seed=args.seed)
    eager = run_decode(session, session.step_fn(), label="eager")
    scoped = copy.deepcopy(model)
    sk.apply_scopes(scoped, plan_for("decoder_layer", analyze_structure(scoped)).scopes)
    scoped_session = prepare(scoped, prompt_len=32, steps=args.steps, warmup=args.warmup, seed=args.seed)
    steps, compile_s, compile_cpu, diffs = {}, {}, {}, {}
    kept: dict[str, list[str]] = {t: [] for t in TIMINGS}
    current = {"timing": TIMINGS[0]}

    def record(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *_: Any) -> None:
        if timings:
            best = min(timings, key=timings.get)
            shapes = " x ".join(str(tuple(int(d) for d in n.get_size())) for n in input_nodes)
            label = "template" if getattr(best, "name", "").startswith("cpp_") else getattr(best, "name", str(best))
            kept[current["timing"]].append(f"{shapes}: {label}")

    from torch._inductor.select_algorithm import add_feedback_saver, clear_feedback_savers

    add_feedback_saver(record)
    for timing in TIMINGS:
        current["timing"] = timing
        cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {"gemm_timing": timing}})
        step = torch.compile(own_code(scoped_session.step_fn(), timing), backend=sk.get_backend(cfg), dynamic=False)
        cpu0 = cpu_seconds()
        first = run_decode(scoped_session, step, label=timing)
        compile_s[timing] = first.compile_seconds
        compile_cpu[timing] = cpu_seconds() - cpu0 - sum(first.step_seconds[1:])
        steps[timing] = step
        print(f"{timing}: compiled in {compile_s[timing]:.1f} s wall, {compile_cpu[timing]:.1f} s CPU", flush=True)
    clear_feedback_savers()
    same_kernels = kept["memory"] == kept["cache"]
    medians: dict[str, list[float]] = {t: [] for t in TIMINGS}
    for r in range(args.rounds):
        order = [TIMINGS[i] for i in rotation(len(TIMINGS), r)]
        for timing in order:
            out = run_decode(scoped_session, steps[timing], label=timing)
            medians[timing].append(out.median_ms)
            diffs[timing] = max(diffs.get(timing, 0.0), (out.logits - eager.logits).abs().max().item())
        print(f"round {r + 1}: " + ", ".join(f"{t} {medians[t][-1]:.1f} ms" for t in TIMINGS), flush=True)
    bw = memory_bandwidth()["read"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    roofline = weights / bw * 1e3
    ratio = statistics.median(m / c for m, c in zip(medians["memory"], medians["cache"]))
    result = {"pages": {**hugepages.settings(), "switch": PAGES}, "hardware": describe_hardware(torch.device("cpu")), "torch": torch.__version__,
              "transformers": transformers.__version__, "layers": args.layers, "threads": args.threads,
              "load_start": load_start, "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
              "eager_ms": eager.median_ms, "weight_roofline_ms": roofline, "read_GBps": bw / 1e9,
              "rows": {t: {"median_ms": statistics.median(medians[t]), "round_medians_ms": medians[t],
                           "x_roofline": statistics.median(medians[t]) / roofline, "compile_s": compile_s[t],
                           "compile_cpu_s": compile_cpu[t], "max_abs_diff_vs_eager": diffs[t]} for t in TIMINGS},
              "memory_over_cache": ratio, "kept": kept, "same_kernels_kept": same_kernels}
    lines = [f"# GEMM choices timed cache-hot vs from memory: Qwen2-0.5B-shaped decode ({args.layers} layers, float32, "
             f"{args.threads} thread(s)), superkernel decoder_layer max-autotune", "",
             f"{result['hardware']}; torch {result['torch']}, transformers {result['transformers']}. Load "
             f"{result['load_start']} at the start, {result['load_end']} at the end. Cold Inductor cache; both compiled "
             f"in one process, timed in {args.rounds} alternating rounds ({args.steps} steps after {args.warmup} warm-up "
             f"each). Weight roofline {roofline:.1f} ms ({weights / 1e9:.3f} GB at {bw / 1e9:.1f} GB/s read).", "",
             "| inductor.gemm_timing | median ms | x roofline | compile s (wall) | compile s (CPU) | max abs diff vs eager |",
             "|---|---|---|---|---|---|"]
    for t in TIMINGS:
        row = result["rows"][t]
        lines.append(f"| {t} | {row['median_ms']:.1f} | {row['x_roofline']:.2f} | {row['compile_s']:.1f} | "
                     f"{row['compile_cpu_s']:.1f} | {row['max_abs_diff_vs_eager']:.2g} |")
    lines += ["", f"memory / cache (median of per-round ratios): {ratio:.3f}; eager {eager.median_ms:.1f} ms.", "",
              "Kernels Inductor kept per GEMM (in lowering order, deduplicated): " + (
                  "the same in both compiles, so the ratio above is the spread between two builds of the same code, "
                  "not an effect of the setting." if same_kernels else "they differ:"), ""]
    for t in TIMINGS:
        lines.append(f"- {t}: " + "; ".join(dict.fromkeys(kept[t])))
    args.output.mkdir(parents=True, exist_ok=True)
    atomic_write(args.output / f"{args.name}.json", json.dumps(result, indent=2) + "\n")
    atomic_write(args.output / f"{args.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
