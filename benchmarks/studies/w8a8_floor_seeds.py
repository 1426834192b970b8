"""How large W8A8's rounding floor is, and how much one measurement of it varies (issue 37's gate at depth).

    .venv/bin/python benchmarks/studies/w8a8_floor_seeds.py [--layers 24] [--seeds 0,1,2] [--output FILE.md]

The product measures the floor as ``optimize``/``bench`` do (``superkernel.tools.advisor.rounding_floor``): eager
once more, fed the same tokens, with the input embeddings' output one ulp off (up or down at random, seeded), and
judges a W8A8 max-autotune plan at ``max(5e-2, 2 x floor)``. This study runs that measurement with several seeds on
llama-tiny and on the Qwen2-0.5B-shaped model of ``benchmarks/quant_decode.py`` (random weights, 1 thread, the
workflow's decode session: 32-token prompt, 4 warm-up and 32 timed steps), for float32 and W8A8, and for the deep
W8A8 model also the other perturbation of ``w8a8_rounding_flips.py`` (its RMSNorm's sum reordered, what a fused
kernel does). Numbers are the largest logit difference over all steps divided by max(1, max |eager logit|).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--output", type=Path, default=None, help="a markdown file for the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from quant_decode import build, reordered_norm

    from superkernel.tools.advisor.rounding_floor import FLOOR_FACTOR, embeddings_one_ulp_off
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models import load_model
    from superkernel.tools.quantize import quantize_model

    seeds = [int(s) for s in args.seeds.split(",") if s]
    lines = [f"W8A8's rounding floor as the workflow measures it (embeddings one ulp off, seeds {seeds}), "
             f"1 thread, relative to the logit scale; the gate is max(5e-2, {FLOOR_FACTOR:g} x floor).", "",
             "| model | scheme | floor per seed | gate per seed | RMSNorm sum reordered | eager s/run |",
             "|---|---|---|---|---|---|"]
    print(lines[0], flush=True)
    for name in ("llama-tiny", f"qwen2-0.5b-shaped, {args.layers} layers"):
        for scheme in ("float32", "w8a8"):
            model = load_model("llama-tiny").model if name == "llama-tiny" else build(args.layers)
            if scheme != "float32":
                quantize_model(model, scheme)
            session = prepare(model, prompt_len=32, steps=32, warmup=4)
            with torch.no_grad():
                start = time.perf_counter()
                eager = run_decode(session, session.step_fn()).logits
                seconds = time.perf_counter() - start
                scale = max(1.0, float(eager.abs().max()))

                def rel(logits: torch.Tensor) -> float:
                    return float((logits - eager).abs().max()) / scale

                floors = []
                for seed in seeds:
                    with embeddings_one_ulp_off(model, seed):
                        floors.append(rel(run_decode(session, session.step_fn()).logits))
                reordered = "-"
                if name != "llama-tiny":
                    with reordered_norm():
                        reordered = f"{rel(run_decode(session, session.step_fn()).logits):.2e}"
            gates = [max(5e-2, FLOOR_FACTOR * f) for f in floors] if scheme == "w8a8" else []
            row = (f"| {name} | {scheme} | {', '.join(f'{f:.2e}' for f in floors)} | "
                   f"{', '.join(f'{g:.3g}' for g in gates) or '- (float32: 1e-3)'} | {reordered} | {seconds:.1f} |")
            print(row, flush=True)
            lines.append(row)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
