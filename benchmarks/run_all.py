"""Run every benchmark in turn (``make bench``); each writes JSON + markdown to benchmarks/results/.

    .venv/bin/python benchmarks/run_all.py [--quick]

Speed targets live here, never in unit tests: each benchmark measures its baselines in
the same run and prints ratios (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and runs (a smoke run, not for figures)")
    args = parser.parse_args(argv)
    runs = [
        ["decode_latency.py"] + (["--steps", "16", "--warmup", "4", "--repeats", "1"] if args.quick else []),
        ["cold_start.py"] + (["--runs", "1"] if args.quick else ["--runs", "5"]),
        ["onnx_autofusion.py", "--looks", "6"] + (["--quick"] if args.quick else []),  # looks: no first-session bias
        ["hf_sweep.py"] + (["--quick"] if args.quick else []),  # >= 20 transformers architectures
        ["tp_cpu.py"] + (["--quick"] if args.quick else []),  # tensor parallelism on CPU vs one process
        ["hf_registry_sweep.py"] + (["--quick"] if args.quick else ["--jobs", "2"]),  # every registered causal LM
        # a Qwen2-0.5B-shaped model, f32 and bf16, 1 and all threads (slow: 24-layer compiles)
        ["real_width.py"] + (["--layers", "2", "--dtypes", "float32", "--threads", "1", "--steps", "4",
                              "--warmup", "1", "--rounds", "1", "--name", "real_width_quick"] if args.quick else []),
    ]
    failed = []
    for script, *rest in runs:
        print(f"\n=== {script} {' '.join(rest)}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *rest])
        if code != 0:
            failed.append(f"{script} (exit {code})")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nresults in {HERE / 'results'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
