"""Compile the decode kernel set (issue 61, ``runtime/cuda/decode_kernels``) for sm_90a on the CPU, without a GPU,
and record each kernel's registers and spills per launch candidate.

    python benchmarks/triton_decode_kernels_sm90a.py [--names qkv_rope,o_proj] [--out DIR]

Needs Triton (``make test-triton`` builds ``.venv-triton``; Triton ships ptxas). Every candidate of
``configs.CANDIDATES`` is launched at Llama-3.2-1B's shapes with its tensors on the ``meta`` device while Triton's
launch is recorded instead of run; each recorded launch is compiled by ``triton.compile`` for
``GPUTarget("cuda", 90, 32)`` (Hopper, sm_90a), and ``ptxas -v`` reads registers, spill stores/loads and stack of the
PTX Triton produced, and again with int8 weights (``<problem> int8``: int8 weight-only, a float32 scale per output
row) for every kernel that reads weights. Zero spills is the target. Writes ``triton_decode_kernels_sm90a.{json,md}``
to ``--out``.
Nothing here is timed: registers say how many programs fit on an SM, not how fast they run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

NAME = "triton_decode_kernels_sm90a"


def compile_all(names: list[str], capability: int = 90) -> list[dict]:
    from superkernel.runtime.cuda.decode_kernels import aot, problems
    from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES, LLAMA_1B, describe

    rows = []
    for name, int8 in [(n, False) for n in names] + [(n, True) for n in names if n in problems.WEIGHTED]:
        for launch in CANDIDATES[name]:
            inputs = problems.make_inputs(name, LLAMA_1B, "meta", int8=int8)
            for recorded in aot.record(problems.call, name, inputs, LLAMA_1B, launch):
                start = time.perf_counter()
                c = aot.compile_launch(recorded, capability)
                rows.append({"problem": f"{name} int8" if int8 else name, "launch": describe(launch),
                             "kernel": c.kernel,
                             "constexprs": c.constexprs,
                             "num_warps": c.options["num_warps"], "num_stages": c.options["num_stages"],
                             "registers": c.registers, "spill_stores": c.spill_stores, "spill_loads": c.spill_loads,
                             "stack_bytes": c.stack_bytes, "shared_bytes": c.shared_bytes,
                             "compile_s": round(time.perf_counter() - start, 2)})
                label = name + (" int8" if int8 else "")
                print(f"{label:14s} {describe(launch):45s} {c.kernel:22s} regs {c.registers:3d} "
                      f"spills {c.spill_stores}/{c.spill_loads} stack {c.stack_bytes} smem {c.shared_bytes}",
                      flush=True)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    spilling = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    lines = ["# The decode kernel set compiled for sm_90a on the CPU (registers and spills)", "",
             f"Triton {meta['triton']}, ptxas {meta['ptxas']}, target `GPUTarget(\"cuda\", 90, 32)`, compiled on "
             f"{meta['host']} without a GPU ({meta['date']}); Llama-3.2-1B shapes (hidden 2048, 32/8 heads of 64, "
             "intermediate 8192, vocab 128256, KV cache 162); `<problem> int8`: int8 weight-only weights with a "
             "float32 scale per output row. Written by "
             "`benchmarks/triton_decode_kernels_sm90a.py`. Not timed: nothing here has run on a GPU.", "",
             f"**{len(rows)} kernels compiled, {len(spilling)} with spills.** Registers are per thread (Hopper: 64K "
             "per SM, at most 255 per thread); shared memory is Triton's allocation per program.", "",
             "| problem | launch | kernel | warps | stages | registers | spill stores / loads (B) | stack B | "
             "shared B |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['launch']} | {r['kernel']} | {r['num_warps']} | {r['num_stages']} | "
                     f"{r['registers']} | {r['spill_stores']} / {r['spill_loads']} | {r['stack_bytes']} | "
                     f"{r['shared_bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from superkernel.runtime.cuda.decode_kernels.problems import NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(NAMES), help=f"problems to compile (default: all: {NAMES})")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    names = [n for n in args.names.split(",") if n]
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown problems {unknown}; allowed: {', '.join(NAMES)}")

    import triton
    from triton.backends.nvidia.compiler import get_ptxas_version

    rows = compile_all(names)
    ptxas = get_ptxas_version(90)
    ptxas = (ptxas.decode() if isinstance(ptxas, bytes) else str(ptxas)).strip().splitlines()[-1]
    meta = {"triton": triton.__version__, "ptxas": ptxas,
            "target": "cuda sm_90a (GPUTarget('cuda', 90, 32))", "host": platform.machine(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps({**meta, "kernels": rows}, indent=2) + "\n")
    (args.out / f"{NAME}.md").write_text(markdown(rows, meta))
    spills = sum(1 for r in rows if r["spill_stores"] or r["spill_loads"])
    print(f"{len(rows)} kernels, {spills} with spills -> {args.out / NAME}.{{json,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
