"""Reduce-overhead against the quantized eager model at real width, bit for bit (issue 37).

    .venv/bin/python benchmarks/studies/quant_ro_vs_eager.py [--schemes w8a8,int8-weight] [--layers 24]

A Qwen2-0.5B-shaped decoder (random weights, ``benchmarks/quant_decode.py``'s), quantized by torchao, all layers in
one scope; a 16-token prompt prefilled in eager, then 12 teacher-forced decode steps through the eager model and
through superkernel's reduce-overhead compile, 1 thread. Prints and writes (``--output``) whether the logits are
identical, the max difference and the top-1 agreement. This found what W8A8 reduce-overhead's "WRONG against
eager" was: transformers' one-token GQA attention branch (``pack_gqa`` in eager, ``repeat_kv`` under Dynamo),
amplified by the per-token activation quantization (docs/quantization.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def decode(model, step, steps: int = 12) -> torch.Tensor:
    import transformers

    from superkernel.hf_cache_names import cache_keyword

    cache = transformers.StaticCache(config=model.config, max_cache_len=64)
    prompt, kw = torch.arange(16).unsqueeze(0) + 3, cache_keyword(model)
    out = []
    with torch.no_grad():
        model(input_ids=prompt, cache_position=torch.arange(16), use_cache=True, **{kw: cache})
        for i in range(steps):
            out.append(step(torch.tensor([[100 + 7 * i]]), torch.tensor([16 + i]), cache))
    return torch.cat(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default="w8a8,int8-weight")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--output", type=Path, default=None, help="a markdown file for the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import superkernel as sk
    from quant_decode import build
    from superkernel.hf_cache_names import cache_keyword
    from superkernel.tools.quantize import quantize_model

    lines = ["| scheme | identical to quantized eager | max abs diff | top-1 agreement | compile + 12 steps |",
             "|---|---|---|---|---|"]
    for scheme in [s for s in args.schemes.split(",") if s]:
        model = build(args.layers)
        quantize_model(model, scheme)
        sk.apply_scopes(model, {"all_layers": "model.layers.*"})
        kw = cache_keyword(model)

        def eager(ids, pos, cache):
            return model(input_ids=ids, cache_position=pos, use_cache=True, **{kw: cache}).logits[:, -1]

        ref = decode(model, eager)
        start = time.perf_counter()
        ro = decode(model, sk.compile(eager, sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})))
        seconds = time.perf_counter() - start
        row = (f"| {scheme} | {torch.equal(ro, ref)} | {float((ro - ref).abs().max()):.3g} | "
               f"{float((ro.argmax(-1) == ref.argmax(-1)).float().mean()):.2f} | {seconds:.0f} s |")
        print(row, flush=True)
        lines.append(row)
        torch._dynamo.reset()
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
