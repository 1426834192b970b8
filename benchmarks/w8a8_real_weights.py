"""The W8A8 question on trained weights (issue 58): do a W8A8 max-autotune plan's greedy tokens equal the quantized
eager model's, and how far is it from eager next to eager's own one-ulp rounding floor?

    superkernel optimize --model smollm2-135m --quantize w8a8 --strategy all_layers --mode max-autotune \\
        --threads 1 --output w8a8_smol
    .venv/bin/python benchmarks/w8a8_real_weights.py --optimize-out w8a8_smol [--new-tokens 24] [--out benchmarks/results]

Part 1 reads the optimize run (teacher-forced over the shipped text): per decode step, the plan's logits against
the quantized eager model's (top-1 agreement, max |diff| in the gate's unit, KL(eager || plan)), beside the floor
the run measured (eager against eager with its embeddings one ulp off) and the quality section (both against the
float model). Part 2 answers chat prompts greedily with the quantized eager model and with the run's plan through
``apply_for_generate`` (the path users take): are the tokens the same, and where they part, how close eager's top
two were. Writes ``w8a8_<model>.{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))

PROMPTS = ("What is the capital of Japan?", "Name three primary colors.", "Write one sentence about the sea.")


def _kl(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    ref, oth = reference.double().log_softmax(-1), other.double().log_softmax(-1)
    return (ref.exp() * (ref - oth)).sum(-1).clamp_min(0)


def from_optimize(out: Path) -> dict[str, Any]:
    """Part 1: the plan against quantized eager in the optimize run, and the run's own floor."""
    from safetensors.torch import load_file

    data = json.loads((out / "results.json").read_text())
    logits = load_file(str(out / "logits.safetensors"))
    plan = next(r for r in data["results"] if r["kind"] == "plan" and not r.get("error"))
    eager, planned = logits["eager"].double(), logits[plan["name"]].double()
    scale = max(1.0, float(eager.abs().max()))
    diff = (planned - eager).abs().max(-1).values
    kl = _kl(eager, planned)
    return {"plan": plan["name"], "passed": plan.get("status") == "passed", "compile_s": plan.get("compile_s"),
            "median_ms": plan.get("decode_ms_median"), "verdict": plan.get("precision_verdict"),
            "steps": int(eager.shape[0]),
            "top1_vs_eager": float((eager.argmax(-1) == planned.argmax(-1)).double().mean()),
            "max_abs_vs_eager": float(diff.max()), "relative_vs_eager": float(diff.max()) / scale,
            "kl_vs_eager_mean": float(kl.mean()), "kl_vs_eager_max": float(kl.max()),
            "tolerance": data.get("tolerance"), "rounding_floor": data.get("rounding_floor"),
            "quality": (data.get("quality") or {}).get("decode"), "hardware": data.get("hardware")}


def _greedy(model: Any, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         cache_implementation="static", output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:], torch.stack(out.scores)[:, 0]


def generate_check(plan: str, new_tokens: int) -> dict[str, Any]:
    """Part 2: greedy answers of the W8A8 eager model and of ``plan`` ("all_layers / max-autotune": the run's plan,
    even where the run recommended torch.compile), prompt by prompt."""
    import superkernel
    from superkernel.tools.models import load_model
    from superkernel.tools.quantize import quantize_model

    loaded = load_model("smollm2-135m")
    model, tok = loaded.model, loaded.tokenizer()
    quantize_model(model, "w8a8")
    inputs = []
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt")
        inputs.append(ids if isinstance(ids, torch.Tensor) else ids["input_ids"])
    torch.manual_seed(0)
    eager = [_greedy(model, ids, new_tokens) for ids in inputs]
    strategy, mode = (part.strip() for part in plan.split("/"))
    superkernel.apply_for_generate(model, strategy, mode=mode)
    started = time.perf_counter()
    first = _greedy(model, inputs[0], new_tokens)
    first_s = time.perf_counter() - started
    planned = [first] + [_greedy(model, ids, new_tokens) for ids in inputs[1:]]
    rows = []
    for prompt, (e_tok, e_scores), (p_tok, _) in zip(PROMPTS, eager, planned):
        same = torch.equal(e_tok, p_tok)
        row = {"prompt": prompt, "same_tokens": same, "eager": tok.decode(e_tok, skip_special_tokens=True),
               "plan": tok.decode(p_tok, skip_special_tokens=True)}
        if not same:
            at = int((e_tok != p_tok).nonzero()[0])
            top2 = e_scores[at].float().topk(2).values
            row.update(parts_at=at, eager_top2_gap=float(top2[0] - top2[1]))
        rows.append(row)
    return {"plan": plan, "new_tokens": new_tokens, "first_generate_s": first_s, "prompts": rows}


def markdown(r: dict[str, Any]) -> str:
    o, floor = r["optimize"], r["optimize"]["rounding_floor"] or {}
    lines = [f"# W8A8 max-autotune on trained weights: {r['model']}", "",
             f"{o['hardware']}; torch {torch.__version__}; {r['date']}.", "",
             f"## Teacher-forced over the shipped text ({o['steps']} decode steps, the optimize run)", "",
             f"Plan `{o['plan']}` (compile {o['compile_s']:.1f} s, {o['median_ms']:.3f} ms/step, passed the gate: "
             f"{o['passed']}: {o['verdict']}; tolerance {o['tolerance']:.3g} of the logit scale).", "",
             "| against quantized eager | top-1 agreement | max abs logit diff | relative (gate unit) | KL mean | KL max |",
             "|---|---:|---:|---:|---:|---:|",
             f"| the plan | {o['top1_vs_eager']:.1%} | {o['max_abs_vs_eager']:.4g} | {o['relative_vs_eager']:.3g} | "
             f"{o['kl_vs_eager_mean']:.2e} | {o['kl_vs_eager_max']:.2e} |",
             f"| eager, embeddings one ulp off (the floor) | {floor.get('top1_agreement', float('nan')):.1%} | "
             f"{floor.get('max_abs', float('nan')):.4g} | {floor.get('relative', float('nan')):.3g} | | |", ""]
    if o.get("quality"):
        lines += ["Against the float model over the same tokens (the report's quality section):", "",
                  "| runner | perplexity | KL mean | KL p99 | top-1 vs float |", "|---|---:|---:|---:|---:|"]
        for name, q in o["quality"].items():
            kl = f"{q['kl_mean']:.2e} | {q['kl_p99']:.2e} | {q['top1']:.1%}" if q.get("kl_mean") is not None else " | | "
            lines.append(f"| {name} | {q['perplexity']:.3f} | {kl} |")
        lines.append("")
    g = r.get("generate")
    if g:
        lines += [f"## Greedy answers, {g['new_tokens']} new tokens (chat template), quantized eager vs the plan "
                  f"through apply_for_generate (first generate() {g['first_generate_s']:.1f} s with its compile)", "",
                  "| prompt | same tokens | parts at | eager's top-2 gap there | eager | plan |", "|---|---|---:|---:|---|---|"]
        for p in g["prompts"]:
            lines.append(f"| {p['prompt']} | {'yes' if p['same_tokens'] else 'no'} | {p.get('parts_at', '')} | "
                         f"{p.get('eager_top2_gap', ''):{'.3f' if 'eager_top2_gap' in p else ''}} | "
                         f"{p['eager']!r} | {p['plan']!r} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optimize-out", type=Path, required=True)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--no-generate", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = {"model": "smollm2-135m", "date": time.strftime("%Y-%m-%d"),
              "optimize": from_optimize(args.optimize_out)}
    if not args.no_generate:
        result["generate"] = generate_check(result["optimize"]["plan"], args.new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w8a8_smollm2-135m.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "w8a8_smollm2-135m.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
