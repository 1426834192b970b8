"""``model.generate()`` tokens/s on a GPU: superkernel plans against Hugging Face's own static-cache recipe.

    PYTHONPATH=src python3 benchmarks/gpu_generate.py --model llama-1b --dtype bfloat16 --out DIR

Plans, each on the same model and prompt, greedy, ``--new-tokens`` tokens (prefill included in the time):

* eager: ``cache_implementation="static"`` with compilation disabled (the reference tokens);
* hf-static-compile: Hugging Face's recipe — a static cache, and ``generate()`` compiling the decode steps
  itself with its default ``CompileConfig`` (``torch.compile`` mode ``reduce-overhead``);
* superkernel: ``superkernel.apply_for_generate(model, STRATEGY, mode=MODE)`` per ``--plans`` entry.

Each plan's first ``generate()`` (it compiles) is timed apart as its compile time; then ``--repeats`` timed
calls; tokens/s from the median. Every plan's tokens are compared with eager's. Writes
``gpu_generate_<model>_<card>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import ROOT, build_model, environment  # noqa: E402


def timed_generate(model: Any, prompt: torch.Tensor, new_tokens: int, **kwargs: Any) -> tuple[torch.Tensor, float]:
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kwargs)
    sync()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plans", default="all_layers:reduce-overhead,all_layers:max-autotune")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only dry-runs the instrument itself")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_generate needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    import superkernel
    from superkernel.tools.generate import remove_for_generate

    device = torch.device(args.device)
    model = build_model(args.model, getattr(torch, args.dtype), device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=gen).to(device)
    rows: list[dict[str, Any]] = []
    reference = None
    plans = [("eager", None, None), ("hf-static-compile", None, None)] + [
        (f"superkernel {p}", *p.split(":")) for p in args.plans.split(",") if p]
    for label, strategy, mode in plans:
        row: dict[str, Any] = {"plan": label}
        try:
            remove_for_generate(model)
            kwargs: dict[str, Any] = {}
            if label == "eager":
                kwargs = {"cache_implementation": "static", "disable_compile": True}
            elif label == "hf-static-compile":
                if device.type != "cuda":
                    raise RuntimeError("transformers compiles generate() by itself on GPUs only")
                kwargs = {"cache_implementation": "static"}
            else:
                superkernel.apply_for_generate(model, strategy, mode=mode)
            tokens, first = timed_generate(model, prompt, args.new_tokens, **kwargs)
            times = [timed_generate(model, prompt, args.new_tokens, **kwargs)[1] for _ in range(args.repeats)]
            median = statistics.median(times)
            if reference is None:
                reference = tokens
            row.update(first_call_s=first, median_s=median, tokens_per_s=args.new_tokens / median,
                       ms_per_token=median / args.new_tokens * 1e3,
                       tokens_equal_eager=bool(torch.equal(tokens, reference)),
                       agreement=float((tokens == reference).float().mean()) if tokens.shape == reference.shape else 0.0)
        except Exception as exc:  # noqa: BLE001 - reported, the other plans go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(traceback.format_exc()[-2000:], flush=True)
        print(row, flush=True)
        rows.append(row)
    remove_for_generate(model)
    hf = next((r for r in rows if r["plan"] == "hf-static-compile" and "median_s" in r), None)
    for r in rows:
        if hf is not None and "median_s" in r:
            r["time_vs_hf"] = r["median_s"] / hf["median_s"]
    env = environment()
    result = {"model": args.model, "dtype": args.dtype, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
              "repeats": args.repeats, "environment": env, "rows": rows}
    card = env.get("card", "gpu").replace("NVIDIA ", "").replace(" ", "_")
    stem = f"gpu_generate_{args.model}_{card}"
    lines = [f"# generate() on {env.get('card')}: {args.model} ({args.dtype})", "",
             f"torch {env['torch']}, transformers {env.get('transformers')}; prompt {args.prompt_len} tokens, "
             f"{args.new_tokens} new tokens, greedy; median of {args.repeats} calls after the first (which compiles; "
             "its time is the first-call column). Tokens compared with eager's static-cache generate().", "",
             "| plan | tokens/s | ms/token | vs HF recipe | first call s | tokens equal eager |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "median_s" not in r:
            lines.append(f"| {r['plan']} | failed: {r.get('error', '')} | | | | |")
            continue
        vs = f"{r['time_vs_hf']:.2f}" if "time_vs_hf" in r else "-"
        lines.append(f"| {r['plan']} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.3f} | {vs} | "
                     f"{r['first_call_s']:.1f} | {r['tokens_equal_eager']} ({r['agreement']:.3f}) |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
