"""Run the benchmarks behind the project's targets in turn (``make bench``); each writes JSON + markdown.

    .venv/bin/python benchmarks/run_all.py [--quick] [--output DIR]

Speed targets live here, never in unit tests: each benchmark measures its baselines in the
same run and prints ratios (benchmarks/README.md says which benchmarks this runs and which are
run by hand; benchmarks/RESULTS.md holds the current figures). A full run overwrites each
configuration's file in benchmarks/results/ (git keeps the earlier runs). ``--quick`` is a smoke
run, not for figures: its files go to a scratch folder (``--output``, default a new temporary
folder) so they never replace a published result.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: script, the flag naming its output folder, its arguments for a full run, for a quick run
BENCHMARKS: list[tuple[str, str, list[str], list[str]]] = [
    ("decode_latency.py", "--output", [], ["--steps", "16", "--warmup", "4", "--repeats", "1"]),
    ("cold_start.py", "--out", ["--runs", "5"], ["--runs", "1"]),
    # looks: fresh sessions per look, no first-session bias
    ("onnx_autofusion.py", "--out", ["--looks", "6"], ["--looks", "6", "--quick"]),
    # the published real-width suite: 3 runs, 4 looks, every tool on glibc's huge pages
    ("onnx_real_width.py", "--out", ["--looks", "4", "--malloc-hugepages"], ["--quick"]),
    ("hf_sweep.py", "--output", [], ["--quick"]),  # >= 20 transformers architectures
    ("tp_cpu.py", "--output", [], ["--quick"]),  # tensor parallelism on CPU vs one process
    ("hf_registry_sweep.py", "--output", ["--jobs", "2"], ["--quick"]),  # every registered causal LM
    # a Qwen2-0.5B-shaped model, f32 and bf16, 1 and all threads (slow: 24-layer compiles)
    ("real_width.py", "--output", [], ["--layers", "2", "--dtypes", "float32", "--threads", "1", "--steps", "4",
                                       "--warmup", "1", "--rounds", "1"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and runs (a smoke run, not for figures)")
    parser.add_argument("--output", type=Path, default=None,
                        help="folder for the results (default: benchmarks/results/, or a new temporary folder with --quick)")
    args = parser.parse_args(argv)
    out = args.output or (Path(tempfile.mkdtemp(prefix="superkernel_bench_quick_")) if args.quick else RESULTS)
    failed = []
    for script, out_flag, full, quick in BENCHMARKS:
        rest = [*(quick if args.quick else full), out_flag, str(out)]
        print(f"\n=== {script} {' '.join(rest)}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *rest])
        if code != 0:
            failed.append(f"{script} (exit {code})")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nresults in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
