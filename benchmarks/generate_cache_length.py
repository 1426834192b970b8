"""What a longer static cache costs a decode step under a plan (the price of rounding its length to a power of two).

    .venv/bin/python benchmarks/generate_cache_length.py [--model smollm2-135m] [--quantize SCHEME]
                                                         [--strategy decoder_layer] [--mode reduce-overhead]
                                                         [--lengths 0,128,256,512,1024] [--new-tokens 33]
                                                         [--rounds 5] [--threads 1] [--out benchmarks/results]

One ``apply_for_generate`` plan; for each cache length (``0``: the call's own length, transformers' sizing without
superkernel's rounding) one compile, then rounds that interleave the lengths: per step = (generate of N tokens -
generate of 1) / (N - 1) of the chat question, ``min_new_tokens`` so that no call stops early; every generate's
tokens checked against the first. Writes ``generate_cache_length_<model>[_<scheme>]_<mode>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "src"))

from generate_common import add_plan_arguments, plan_model, stem  # noqa: E402

from superkernel.tools import generate_cache  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_plan_arguments(ap)
    ap.add_argument("--lengths", default="0,128,256,512,1024")
    args = ap.parse_args()
    model, tok, ids = plan_model(args)
    n, lengths = args.new_tokens, [int(x) for x in args.lengths.split(",")]

    def generate(length: int, new: int) -> tuple[float, torch.Tensor]:
        generate_cache.remove(model)
        if length:
            generate_cache.install(model, length)
        model.__dict__.pop("_previous_max_cache_length", None)  # transformers' floor from earlier calls
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        return time.perf_counter() - start, out

    reference, compile_s = None, {}
    for length in lengths:
        compile_s[length], out = generate(length, n)
        reference = out if reference is None else reference
    per_step: dict[int, list[float]] = {length: [] for length in lengths}
    for _ in range(args.rounds):
        for length in lengths:
            whole, tokens = generate(length, n)
            prompt, _ = generate(length, 1)
            if not torch.equal(tokens, reference):
                raise SystemExit(f"cache length {length}: tokens differ from the first generate()'s")
            per_step[length].append((whole - prompt) / (n - 1) * 1e3)
    med = {length: statistics.median(v) for length, v in per_step.items()}
    own = ids.shape[1] + n - 1
    result = {"model": args.model, "quantize": args.quantize, "strategy": args.strategy, "mode": args.mode,
              "threads": args.threads, "rounds": args.rounds, "new_tokens": n, "own_length": own,
              "torch": torch.__version__, "load": os.getloadavg(), "first_generate_s": compile_s,
              "ms_per_step": per_step, "median_ms": med}
    stem_path = stem(args, "generate_cache_length")
    stem_path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    base = med[lengths[0]]
    lines = [f"# A decode step's cost against its static cache's length: {args.model} "
             f"{args.quantize or 'float32'}, {args.strategy} / {args.mode}", "",
             f"`benchmarks/generate_cache_length.py`, {args.threads} thread(s), torch {torch.__version__}, "
             f"{args.rounds} rounds interleaving the lengths; per step = (generate of {n} tokens - generate of 1) / "
             f"{n - 1}, `min_new_tokens` (no early stop); every generate gave the same tokens; load average "
             f"{', '.join(f'{x:.2f}' for x in result['load'])}. The call's own length: {own} positions.", "",
             "| cache length | ms per decode step (median) | vs the first row | first generate (compile) s | rounds |",
             "|---|---|---|---|---|"]
    for length in lengths:
        label = f"{own} (the call's own: transformers' sizing)" if length == 0 else str(length)
        lines.append(f"| {label} | {med[length]:.2f} | {med[length] / base:.3f} | {compile_s[length]:.1f} | "
                     + ", ".join(f"{x:.1f}" for x in per_step[length]) + " |")
    stem_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
