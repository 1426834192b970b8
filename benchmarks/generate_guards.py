"""generate() under a plan with Dynamo's guards checked on every decode step, and checked once per signature.

    .venv/bin/python benchmarks/generate_guards.py [--model smollm2-135m] [--strategy decoder_layer]
                                                   [--mode reduce-overhead] [--rounds 5] [--threads 1]
                                                   [--out benchmarks/results]

One model, one ``apply_for_generate`` plan; per round and per way, ``generate(max_new_tokens=33)`` (``--new-tokens``) and
``generate(max_new_tokens=1)`` (the prompt alone) of the chat question, the difference over 32 decode steps
(``min_new_tokens`` keeps the model from stopping early); ``--quantize`` quantizes the model first; the two
ways alternate in each round on the same compiled step (``superkernel.tools.generate_guards`` installed or not).
Every generate's tokens are checked against the first one's. Writes
``generate_guards_<model>[_<scheme>]_<mode>.{json,md}``.
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

from superkernel.tools import generate_guards  # noqa: E402

WAYS = ("guards checked every step", "guards checked once per signature")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_plan_arguments(ap)
    args = ap.parse_args()
    model, tok, ids = plan_model(args)

    def generate(n: int) -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - start, out

    start = time.perf_counter()
    n = args.new_tokens
    reference = generate(n)[1]
    compile_s = time.perf_counter() - start
    per_step: dict[str, list[float]] = {w: [] for w in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            generate_guards.remove(model)
            if way == WAYS[1]:
                generate_guards.install(model)
            whole, tokens = generate(n)
            prompt, _ = generate(1)
            if not torch.equal(tokens, reference):
                raise SystemExit(f"{way}: tokens differ from the first generate()'s")
            per_step[way].append((whole - prompt) / (n - 1) * 1e3)
    med = {w: statistics.median(v) for w, v in per_step.items()}
    answer = tok.decode(reference[0, ids.shape[1]:], skip_special_tokens=True)
    result = {"model": args.model, "quantize": args.quantize, "new_tokens": n, "strategy": args.strategy, "mode": args.mode, "threads": args.threads,
              "rounds": args.rounds, "torch": torch.__version__, "load": os.getloadavg(),
              "first_generate_s": compile_s, "ms_per_step": per_step, "median_ms": med,
              "counts": generate_guards.counts(model), "answer": answer}
    stem_path = stem(args, "generate_guards")
    stem_path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# generate() decode steps with and without Dynamo's guard check on every step: {args.model}"
             f"{' ' + args.quantize if args.quantize else ''}", "",
             f"`benchmarks/generate_guards.py`, {args.quantize or 'float32'}, `apply_for_generate(model, \"{args.strategy}\", mode=\"{args.mode}\")`, "
             f"{args.threads} thread(s), torch {torch.__version__}, {args.rounds} rounds alternating the two ways on "
             f"the same compiled step; per step = (generate of {n} tokens - generate of 1) / {n - 1} (`min_new_tokens`: no "
             f"early stop); load average "
             f"{', '.join(f'{x:.2f}' for x in result['load'])}. First generate (compile): {compile_s:.1f} s. Every "
             f"generate gave the first one's {n} tokens ({answer!r}).", "",
             "| way | ms per decode step (median) | rounds |", "|---|---|---|"]
    for way in WAYS:
        lines.append(f"| {way} | {med[way]:.2f} | {', '.join(f'{x:.1f}' for x in per_step[way])} |")
    lines += ["", f"once per signature / every step: **{med[WAYS[1]] / med[WAYS[0]]:.2f}x**; the last generate's "
              f"decode calls (checked, skipped): {result['counts']}."]
    stem_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
