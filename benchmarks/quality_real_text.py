"""Quality on real text of SmolLM2-135M (issue 58): float, bfloat16, our quantizations and llama.cpp's, same tokens.

    .venv/bin/python benchmarks/quality_real_text.py [--model smollm2-135m] [--eval-text FILE] [--window 512]
                                                     [--no-llamacpp] [--out benchmarks/results]

The reference is the model as transformers dequantizes the GGUF file, in float32, eager. Every other runner is
scored against it over the same token ids of the evaluation text (the one ``superkernel optimize`` reads by
default, ``superkernel.tools.quality``), in non-overlapping windows of ``--window`` tokens, each window starting
without context: perplexity of the text, KL(float32 || runner) per position (mean and p99) and top-1
agreement with float32 -- what llama.cpp's ``llama-perplexity --kl-divergence`` reports.

Runners: float32 and bfloat16 eager; each quantization scheme superkernel offers (torchao, eager: a plan's
reduce-overhead mode computes exactly this, max-autotune within its gate); and, when ``llama-cpp-python`` is
installed (``make peers``), llama.cpp on the shipped file (Q4_1) and on Q8_0 / Q4_0 / F16 files its own
``llama_model_quantize`` makes from it (requantized: the same weights as the float reference, since that
reference is the Q4_1 file dequantized). llama.cpp is fed the same ids per window (one batch, ``logits_all``).

Writes ``quality_<model>.{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))

from superkernel.tools.models import load_model  # noqa: E402
from superkernel.tools.quality import model_logits, read_text, text_quality, token_ids  # noqa: E402

LLAMACPP_TYPES = ("Q8_0", "Q4_0", "F16")


def llamacpp_logits(path: Path, ids: torch.Tensor, window: int, threads: int) -> torch.Tensor:
    """llama.cpp's next-token logits over ``ids`` in the same windows as :func:`model_logits`."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=window + 8, n_batch=window, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False)
    out = []
    try:
        for start in range(0, ids.shape[0] - 1, window):
            chunk = ids[start:start + window].tolist()
            llm.reset()
            llm.eval(chunk)
            rows = np.array(llm.scores[: llm.n_tokens], dtype=np.float32)
            out.append(torch.from_numpy(rows[: min(window, ids.shape[0] - 1 - start)]))
    finally:
        llm.close()
    return torch.cat(out)


def requantize(src: Path, dst: Path, kind: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
                                       "F16": "LLAMA_FTYPE_MOSTLY_F16", "F32": "LLAMA_FTYPE_ALL_F32"}[kind])
    params.nthread = threads
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize {kind} failed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--eval-text", type=Path, default=None)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--tokens", type=int, default=None, help="score the text's first N tokens only (default: all)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args(argv)
    from superkernel.tools.quantize import SCHEMES, quantize_model

    started = time.perf_counter()
    reference_model = load_model(args.model, dtype="float32")
    if reference_model.gguf is None or reference_model.tokenizer_dir is None:
        p.error(f"{args.model} is not a GGUF model with a tokenizer")
    text_name, text = read_text(args.eval_text)
    ids = token_ids(reference_model.tokenizer(), text, args.tokens)
    targets = ids[1:]
    reference = model_logits(reference_model.model, ids, args.window)
    rows: list[dict[str, Any]] = []

    def add(runner: str, weights: str, logits: torch.Tensor, note: str = "") -> None:
        q = text_quality(logits, targets, reference)
        rows.append({"runner": runner, "weights": weights, **q.to_dict(), "note": note})
        print(f"{runner:<34} {weights:<28} ppl {q.perplexity:8.3f}  KL {q.kl_mean:.2e} / p99 {q.kl_p99:.2e}  "
              f"top-1 {q.top1:.1%}", flush=True)

    add("eager float32 (reference)", "GGUF Q4_1, dequantized", reference)
    bf16 = load_model(args.model, dtype="bfloat16")
    add("eager bfloat16", "GGUF Q4_1, dequantized", model_logits(bf16.model, ids, args.window))
    del bf16
    for scheme in SCHEMES:
        model = copy.deepcopy(reference_model.model)
        info = quantize_model(model, scheme)
        group, head = info.group_size, info.head.partition(": ")[2]
        label = f"superkernel {scheme}" + (f" (group {group})" if group else "") + (
            f", head {head}" if head and head != scheme else "")
        add(label, "float32 model requantized by torchao", model_logits(model, ids, args.window),
            note=f"{getattr(info, 'layers', '?')} linear layers quantized")
        del model
    llamacpp: dict[str, Any] = {"installed": False}
    if not args.no_llamacpp:
        try:
            import llama_cpp
        except ImportError as exc:
            llamacpp["why"] = f"llama-cpp-python not installed ({exc}); make peers installs it"
        else:
            llamacpp = {"installed": True, "version": llama_cpp.__version__}
            src = Path(reference_model.gguf["path"])
            add(f"llama.cpp {reference_model.gguf['file_type']} (as shipped)", "the GGUF file",
                llamacpp_logits(src, ids, args.window, args.threads))
            with tempfile.TemporaryDirectory() as tmp:
                for kind in LLAMACPP_TYPES:
                    dst = Path(tmp) / f"model-{kind}.gguf"
                    requantize(src, dst, kind, args.threads)
                    add(f"llama.cpp {kind}", "requantized from the file by llama.cpp",
                        llamacpp_logits(dst, ids, args.window, args.threads))
    report = {"model": args.model, "gguf": reference_model.gguf, "text": text_name, "text_tokens": int(ids.shape[0]),
              "window": args.window, "reference": "eager float32 of the dequantized GGUF file", "rows": rows,
              "llamacpp": llamacpp, "torch": torch.__version__, "cpu": cpu_name(), "threads": torch.get_num_threads(),
              "seconds": time.perf_counter() - started}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"quality_{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {stem}.json and .md")
    return 0


def cpu_name() -> str:
    """The CPU's model name and its widest vector ISA (quality does not depend on it; kernels chosen by it do)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    isa = "AVX-512" if " avx512f" in info else ("AVX2" if " avx2" in info else "no AVX2")
    return f"{name} ({isa})"


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Quality on real text: {r['model']}", "",
             f"Text: *{r['text']}*, {r['text_tokens']} tokens in windows of {r['window']} (each without context). "
             f"Reference: {r['reference']}. KL in nats per position. Same token ids for every runner. "
             f"CPU: {r['cpu']}, torch {r['torch']}, {r['threads']} thread(s); {r['seconds']:.0f} s in all.", "",
             "| runner | weights | perplexity | KL mean | KL p99 | top-1 vs float32 |", "|---|---|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['runner']} | {row['weights']} | {row['perplexity']:.3f} | {row['kl_mean']:.2e} | "
                     f"{row['kl_p99']:.2e} | {row['top1']:.1%} |")
    if not r["llamacpp"].get("installed"):
        lines += ["", f"llama.cpp: not measured ({r['llamacpp'].get('why', 'skipped')})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
