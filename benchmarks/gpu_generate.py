"""``model.generate()`` tokens/s on a GPU: superkernel plans against Hugging Face's own static-cache recipe.

    PYTHONPATH=src python3 benchmarks/gpu_generate.py --model llama-1b --dtype bfloat16 --out DIR

Plans, each on the same model and prompt, greedy, ``--new-tokens`` tokens (prefill included in the time):

* eager: ``cache_implementation="static"`` with compilation disabled (the reference tokens);
* hf-static-compile: Hugging Face's recipe — a static cache, and ``generate()`` compiling the decode steps
  itself with its default ``CompileConfig`` (``torch.compile`` mode ``reduce-overhead``);
  ``hf-static-compile-max-autotune``: the same with ``CompileConfig(mode="max-autotune")`` (``--hf-modes``);
* superkernel: ``superkernel.apply_for_generate(model, STRATEGY, mode=MODE)`` per ``--plans`` entry
  ``STRATEGY:MODE``; ``STRATEGY:MODE:decode-kernels`` turns on ``experimental_config.cuda_decode_kernels``
  (superkernel's own Triton decode kernels, issue 61; the row says what the hookup did or why it declined).

Plans run in the order given: eager first, then the HF recipes of ``--hf-modes`` and the ``--plans`` entries, or,
where ``--plans`` names recipes itself (``hf:MODE`` entries), exactly its order (a slow ``max-autotune`` compile
placed last cannot starve the rest). The result files are rewritten after every row, so a run stopped by its time
limit keeps what it measured. Each plan's first ``generate()`` (it compiles) is timed apart as
its compile time; then ``--repeats`` timed calls; tokens/s from the median. Every plan's tokens are compared with
eager's. Writes ``gpu_generate_<model>_<card>.{json,md}``.

``--dry-run``: the same code paths on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``), on a 2-layer
Llama of hidden size 64 (``dry-run-llama``: the interpreter runs every program of every kernel in Python) in
bfloat16 with 3 new tokens, superkernel plans captured but not compiled (``debug.run_eagerly``: Inductor's CPU
compile is not what a dry run checks) and the HF recipes skipped (transformers compiles ``generate()`` on GPUs
only): every row, the hookup's record and the tables, no figures (``gpu_generate_dry-run-llama[_TAG]_dry-run.*``).
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


DECODE_KERNELS = "decode-kernels"
DRY_RUN_MODEL = "dry-run-llama"


def dry_run_model(dtype: torch.dtype) -> torch.nn.Module:
    """A 2-layer Llama small enough for Triton's interpreter (random weights, on the CPU)."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)


def hf_label(mode: str) -> str:
    return "hf-static-compile" if mode == "reduce-overhead" else f"hf-static-compile-{mode}"


def parse_plans(text: str) -> list[tuple[str, str | None, str, bool]]:
    """``--plans`` as (label, strategy, mode, decode kernels) rows; ``hf:MODE`` is HF's recipe in that mode
    (strategy None)."""
    rows: list[tuple[str, str | None, str, bool]] = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        if parts[0] == "hf" and len(parts) == 2:
            rows.append((hf_label(parts[1]), None, parts[1], False))
            continue
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != DECODE_KERNELS):
            raise ValueError(f"--plans entries are STRATEGY:MODE or STRATEGY:MODE:{DECODE_KERNELS}, got {item!r}")
        rows.append((f"superkernel {item}", parts[0], parts[1], len(parts) == 3))
    return rows


def superkernel_config(mode: str, decode_kernels: bool, dry_run: bool) -> Any:
    import superkernel

    cfg = superkernel.CompilerConfig()
    cfg.mode = mode
    cfg.experimental_config.cuda_decode_kernels = decode_kernels
    cfg.debug.run_eagerly = dry_run  # the dry run captures, it does not compile (see the module's docstring)
    return cfg


def apply_plan(model: Any, strategy: str, mode: str, decode_kernels: bool, dry_run: bool) -> dict[str, Any]:
    """``apply_for_generate`` with the plan; returns what the hookup did (or the warnings saying why not)."""
    import warnings

    import superkernel
    from superkernel.runtime.cuda.decode_kernels.hookup import hookup_of

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        superkernel.apply_for_generate(model, strategy, mode=mode,
                                       compiler_config=superkernel_config(mode, decode_kernels, dry_run))
    notes = sorted({str(w.message) for w in caught if "decodes with Inductor's kernels" in str(w.message)})
    hooked = hookup_of(model)
    info: dict[str, Any] = {}
    if decode_kernels:
        info["decode_kernels"] = hooked.describe() if hooked is not None else "declined: " + "; ".join(notes)
    return info


def write_results(args: Any, rows: list[dict[str, Any]], stem: str, env: dict[str, Any]) -> list[str]:
    hf = next((r for r in rows if r["plan"] == "hf-static-compile" and "median_s" in r), None)
    for r in rows:
        if hf is not None and "median_s" in r:
            r["time_vs_hf"] = r["median_s"] / hf["median_s"]
    result = {"model": args.model, "dtype": args.dtype, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
              "repeats": args.repeats, "dry_run": args.dry_run, "environment": env, "rows": rows}
    where = "the CPU under Triton's interpreter (a dry run: no figures)" if args.dry_run else env.get("card")
    lines = [f"# generate() on {where}: {args.model} ({args.dtype})", "",
             f"torch {env['torch']}, transformers {env.get('transformers')}; prompt {args.prompt_len} tokens, "
             f"{args.new_tokens} new tokens, greedy; median of {args.repeats} calls after the first (which compiles; "
             "its time is the first-call column). Tokens compared with eager's static-cache generate()."
             + (" Dry run: superkernel plans captured and run op by op (debug.run_eagerly), times meaningless."
                if args.dry_run else ""), "",
             "| plan | tokens/s | ms/token | vs HF recipe | first call s | tokens equal eager | decode kernels |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        dk = r.get("decode_kernels", "")
        if "median_s" not in r:
            lines.append(f"| {r['plan']} | {r.get('skipped') or 'failed: ' + r.get('error', '')} | | | | | {dk} |")
            continue
        vs = f"{r['time_vs_hf']:.2f}" if "time_vs_hf" in r else "-"
        lines.append(f"| {r['plan']} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.3f} | {vs} | "
                     f"{r['first_call_s']:.1f} | {r['tokens_equal_eager']} ({r['agreement']:.3f}) | {dk} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return lines


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
    parser.add_argument("--hf-modes", default="reduce-overhead",
                        help="the HF recipe's torch.compile modes, comma-separated (reduce-overhead, max-autotune)")
    parser.add_argument("--tag", default="", help="a name part of the result files: gpu_generate_<model>_<tag>_<card>")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU under Triton's interpreter, llama-tiny, 3 tokens, plans not compiled")
    args = parser.parse_args(argv)
    if args.dry_run:
        import os

        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported (the decode kernels import it lazily)
        args.device, args.model, args.new_tokens, args.repeats = "cpu", DRY_RUN_MODEL, 3, 1
        args.prompt_len = min(args.prompt_len, 8)
        from superkernel.runtime.cuda.decode_kernels.interpret import fix_bf16

        fix_bf16()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_generate needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    from superkernel.tools.generate import remove_for_generate

    device = torch.device(args.device)
    model = (dry_run_model(getattr(torch, args.dtype)) if args.model == DRY_RUN_MODEL
             else build_model(args.model, getattr(torch, args.dtype), device))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=gen).to(device)
    rows: list[dict[str, Any]] = []
    reference = None
    given = parse_plans(args.plans)
    hf = [(hf_label(m), None, m, False) for m in filter(None, args.hf_modes.split(","))]
    plans = [("eager", None, None, False)] + (given if any(s is None for _, s, _, _ in given) else hf + given)
    env = environment()
    card = "dry-run" if args.dry_run else env.get("card", "gpu").replace("NVIDIA ", "").replace(" ", "_")
    stem = "_".join(filter(None, ["gpu_generate", args.model, args.tag, card]))
    for label, strategy, mode, decode_kernels in plans:
        row: dict[str, Any] = {"plan": label}
        try:
            remove_for_generate(model)
            kwargs: dict[str, Any] = {}
            if label == "eager":
                kwargs = {"cache_implementation": "static", "disable_compile": True}
            elif label.startswith("hf-static-compile"):
                if device.type != "cuda":
                    row["skipped"] = "skipped: transformers compiles generate() by itself on GPUs only"
                    rows.append(row)
                    continue
                kwargs = {"cache_implementation": "static"}
                if mode != "reduce-overhead":
                    from transformers import CompileConfig

                    kwargs["compile_config"] = CompileConfig(mode=mode)
            else:
                row.update(apply_plan(model, strategy, mode, decode_kernels, args.dry_run))
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
        write_results(args, rows, stem, env)  # after every row: a run stopped by its limit keeps what it measured
    remove_for_generate(model)
    print("\n".join(write_results(args, rows, stem, env)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
