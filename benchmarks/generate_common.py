"""What the ``generate()`` benchmarks share (``generate_guards.py``, ``generate_cache_length.py``): their arguments
for one plan on one model, and that model loaded, quantized, with the plan applied, and the chat question's ids."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))


def add_plan_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quantize", default=None, help="a scheme of superkernel.tools.quantize (default: none)")
    ap.add_argument("--strategy", default="decoder_layer")
    ap.add_argument("--mode", default="reduce-overhead")
    ap.add_argument("--new-tokens", type=int, default=33)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "results"))


def plan_model(args: argparse.Namespace) -> tuple[Any, Any, torch.Tensor]:
    """``(model, tokenizer, chat question ids)``: the model quantized as asked, ``apply_for_generate`` applied."""
    import superkernel
    from superkernel.tools.advisor.answer import chat_ids
    from superkernel.tools.models import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer()
    ids = chat_ids(tok) if tok is not None else None
    if ids is None:
        raise SystemExit(f"{args.model}: these benchmarks ask the chat question, and this model has no tokenizer with "
                         "a chat template (take a real model: smollm2-135m)")
    if args.quantize:
        from superkernel.tools.quantize import quantize_model

        quantize_model(model, args.quantize)
    superkernel.apply_for_generate(model, args.strategy, mode=args.mode)
    return model, tok, ids


def stem(args: argparse.Namespace, name: str) -> Path:
    """The result files' path without suffix: ``<out>/<name>_<model>[_<scheme>]_<mode>``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}_{args.model}{'_' + args.quantize if args.quantize else ''}_{args.mode}"
