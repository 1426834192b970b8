"""The prompt (prefill) of an int4 model under a plan: ATen's float32 int4 loop against superkernel's int4 kernel.

    .venv/bin/python benchmarks/int4_prompt.py [--model smollm2-135m] [--lengths 37,128] [--rounds 3] [--threads 1]
                                               [--out benchmarks/results]

``generate(max_new_tokens=1)`` (the prompt alone: nothing compiles) with ``apply_for_generate(model,
"decoder_layer", mode=...)`` on: the float32 model (max-autotune plan: its prompt is eager float32), the int4-weight
model under a reduce-overhead plan (its prompt is eager: torchao -> ATen's ``_weight_int4pack_mm_for_cpu``) and
under a max-autotune plan (its prompt's int4 calls run superkernel's kernel, ``runtime/cpu/int4_eager.py``).
Prompts: the chat question of ``superkernel optimize``'s answer check (its own length), then the first N tokens of
the shipped evaluation text for each other length. Rounds interleave the runners; the median is reported, with
each runner's first token and the int4 kernel's largest logit difference from ATen's.

Writes ``int4_prompt_<model>.{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))

import superkernel  # noqa: E402
from superkernel.tools import generate_int4_prompt  # noqa: E402
from superkernel.tools.advisor.answer import chat_ids  # noqa: E402
from superkernel.tools.models import load_model  # noqa: E402
from superkernel.tools.quality import read_text, token_ids  # noqa: E402
from superkernel.tools.quantize import quantize_model  # noqa: E402


def prompts(loaded, lengths: list[int]) -> dict[str, torch.Tensor]:
    tok = loaded.tokenizer()
    chat = chat_ids(tok)
    text = token_ids(tok, read_text(None)[1])
    out = {f"chat question ({chat.shape[1]} tokens)": chat}
    for n in lengths:
        if n != chat.shape[1]:
            out[f"{n} tokens of the evaluation text"] = text[:n].reshape(1, -1)
    return out


def first_token(model, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=1, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return time.perf_counter() - start, out.logits[0][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="37,128", help="prompt lengths (the chat question is one of them)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    float_model = loaded.model
    int4 = copy.deepcopy(float_model)
    info = quantize_model(int4, "int4-weight")
    runners = {"float32, max-autotune plan (eager float32 prompt)":
               superkernel.apply_for_generate(float_model, "decoder_layer", mode="max-autotune"),
               "int4-weight, reduce-overhead plan (ATen's float32 int4 loop)":
               superkernel.apply_for_generate(copy.deepcopy(int4), "decoder_layer", mode="reduce-overhead"),
               "int4-weight, max-autotune plan (superkernel's int4 kernel)":
               superkernel.apply_for_generate(int4, "decoder_layer", mode="max-autotune")}
    names = list(runners)
    rows = []
    for label, ids in prompts(loaded, [int(n) for n in args.lengths.split(",")]).items():
        times: dict[str, list[float]] = {name: [] for name in names}
        logits: dict[str, torch.Tensor] = {}
        for _ in range(args.rounds):
            for name in names:
                seconds, logits[name] = first_token(runners[name], ids)
                times[name].append(seconds)
        aten, ours = logits[names[1]], logits[names[2]]
        rows.append({"prompt": label, "tokens": int(ids.shape[1]),
                     "seconds": {n: statistics.median(t) for n, t in times.items()},
                     "all_seconds": times, "first_token": {n: int(v.argmax()) for n, v in logits.items()},
                     "kernel_vs_aten_max_rel": float((ours - aten).abs().max() / aten.abs().max())})
    result = {"model": args.model, "threads": args.threads, "rounds": args.rounds, "quantization": info.to_dict(),
              "torch": torch.__version__, "load": os.getloadavg(), "rows": rows,
              "routed": getattr(runners[names[2]], generate_int4_prompt.ATTR).routed}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"int4_prompt_{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The prompt of an int4 model under a plan: {args.model}", "",
             f"`benchmarks/int4_prompt.py`, {args.threads} thread(s), {args.rounds} interleaved rounds (median), "
             f"torch {torch.__version__}, load average {', '.join(f'{x:.2f}' for x in result['load'])}; "
             f"`generate(max_new_tokens=1)` after `apply_for_generate(model, \"decoder_layer\", mode=...)` (the prompt "
             f"alone, nothing compiles). int4-weight: {info.to_dict().get('group_size')} per group "
             f"(output head {info.head or 'as the body'}).", "",
             "| prompt | " + " | ".join(names) + " | ATen / kernel | kernel vs ATen (max logit diff / max logit) "
             "| first tokens |", "|---|" + "---|" * (len(names) + 3)]
    for row in rows:
        s = row["seconds"]
        lines.append(f"| {row['prompt']} | " + " | ".join(f"{s[n]:.2f} s" for n in names)
                     + f" | {s[names[1]] / s[names[2]]:.1f}x | {row['kernel_vs_aten_max_rel']:.1e} | "
                     + ", ".join(str(t) for t in row["first_token"].values()) + " |")
    lines += ["", f"int4 calls the kernel ran in the max-autotune plan's prompts: {result['routed']}."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
