"""Why no compiler that reorders float arithmetic can give W8A8 eager's greedy tokens on random weights (issue 37).

    .venv/bin/python benchmarks/studies/w8a8_rounding_flips.py [--layers 24] [--steps 32] [--output FILE.md]

A Qwen2-0.5B-shaped decoder (random weights, ``benchmarks/quant_decode.py``'s), 1 thread, in eager only: the model
as it is, and the same model whose RMSNorm sums its squares in another order (the even and the odd elements apart,
then the two sums, instead of ``x.pow(2).mean(-1)``: the same float32 arithmetic reordered, as a fused norm kernel
with other vector lanes does). Each is decoded
greedily from the same 16-token prompt for ``--steps`` tokens, free running as ``generate()`` does, for float32,
int8 weight-only and W8A8. Prints and writes whether the two decodes give the same tokens, where they part, the
max logit difference before that, and the eager model's gap between its first and second choice there.

What it shows: float32 and int8 weight-only absorb a last-bit difference (logits move by ~1e-6); W8A8 rounds every
activation to 1/127 of its token's range, so the same difference moves a value across a rounding boundary, one
int8 step that the following layers carry, and the logits move by ~1e-1 -- enough to flip a greedy pick whose two
best logits are that close. A max-autotune plan and ``torch.compile`` reorder exactly such sums, so their W8A8
tokens can differ from eager's where eager's own reordered twin's do; reduce-overhead runs eager's kernels and
gives eager's tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def greedy(model, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Free-running greedy decode after a 16-token prompt: (tokens [steps], logits [steps, vocab])."""
    import transformers

    from superkernel.hf_cache_names import cache_keyword

    cache = transformers.StaticCache(config=model.config, max_cache_len=16 + steps + 1)
    kw = cache_keyword(model)
    tokens, logits = [], []
    with torch.no_grad():
        out = model(input_ids=torch.arange(16).unsqueeze(0) + 3, cache_position=torch.arange(16), use_cache=True,
                    **{kw: cache}).logits[:, -1]
        for i in range(steps):
            logits.append(out[0])
            tokens.append(int(out.argmax(-1)))
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([16 + i]),
                        use_cache=True, **{kw: cache}).logits[:, -1]
    return torch.tensor(tokens), torch.stack(logits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default="float32,int8-weight,w8a8")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--output", type=Path, default=None, help="a markdown file for the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from quant_decode import build, reordered_norm
    from superkernel.tools.quantize import quantize_model

    lines = [f"Qwen2-0.5B-shaped, {args.layers} layers, random weights, 1 thread, greedy decode of {args.steps} "
             "tokens; eager against eager with its RMSNorm's sum reordered.", "",
             "| model | same tokens | first differing step | max logit diff before it | eager's top-2 gap there |",
             "|---|---|---|---|---|"]
    print(lines[0], flush=True)
    for scheme in [s for s in args.schemes.split(",") if s]:
        model = build(args.layers)
        if scheme != "float32":
            quantize_model(model, scheme)
        tokens, logits = greedy(model, args.steps)
        with reordered_norm():
            other_tokens, other_logits = greedy(model, args.steps)
        parted = [i for i in range(args.steps) if tokens[i] != other_tokens[i]]
        first = parted[0] if parted else args.steps
        upto = first + 1 if parted else args.steps  # the differing step itself still had the same input
        diff = float((logits[:upto] - other_logits[:upto]).abs().max())
        gap = "-"
        if parted:
            top2 = logits[first].topk(2).values
            gap = f"{float(top2[0] - top2[1]):.3g}"
        row = (f"| {scheme} | {'yes' if not parted else 'no'} | {first if parted else '-'} | {diff:.3g} | {gap} |")
        print(row, flush=True)
        lines.append(row)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
