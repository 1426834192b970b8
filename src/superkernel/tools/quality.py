"""Quality on real text, in the units users pick a quantization by: perplexity, KL divergence from the float
model (mean and 99th percentile over positions) and top-1 agreement with it, over the same tokens.

These are the figures llama.cpp's perplexity tool reports (``--kl-divergence``), computed here from logits any
runner produced for the same token ids: the float eager model (the reference), a quantized model, a compiled
plan's decode steps, or llama.cpp itself. The default text is :data:`EVAL_TEXT_NAME`, plain English the project
wrote for this (no third-party prose); ``--eval-text FILE`` reads another (UTF-8, at most :data:`MAX_TEXT_BYTES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

EVAL_TEXT_NAME = "superkernel eval text (tools/data/eval_text.txt)"
MAX_TEXT_BYTES = 8 << 20


def default_text() -> str:
    from importlib.resources import files

    return files("superkernel.tools").joinpath("data/eval_text.txt").read_text(encoding="utf-8")


def read_text(path: Path | str | None) -> tuple[str, str]:
    """``(name, text)`` of ``--eval-text`` (a UTF-8 file) or of the shipped text when ``path`` is None."""
    if path is None:
        return EVAL_TEXT_NAME, default_text()
    from superkernel.util import InputFileError, read_limited, safe_text

    try:
        raw = read_limited(path, MAX_TEXT_BYTES, "--eval-text")
    except InputFileError as exc:
        raise ValueError(str(exc)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--eval-text {safe_text(path)} is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise ValueError(f"--eval-text {safe_text(path)} is empty")
    return str(path), text


def token_ids(tokenizer: Any, text: str, limit: int | None = None) -> torch.Tensor:
    """The text's token ids ``[n]`` (no special tokens added), at most ``limit``."""
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return ids[:limit] if limit else ids


@dataclass
class TextQuality:
    """One runner's quality over ``tokens`` predicted positions of a text."""

    tokens: int
    perplexity: float
    kl_mean: float | None = None      # KL(reference || this), nats per position; None: no reference given
    kl_p99: float | None = None
    top1: float | None = None         # share of positions whose argmax equals the reference's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def text_quality(logits: torch.Tensor, targets: torch.Tensor, reference: torch.Tensor | None = None) -> TextQuality:
    """Quality of next-token ``logits`` ``[n, vocab]`` predicting ``targets`` ``[n]``, against the ``reference``
    logits of the float model at the same positions (KL and top-1), computed in float64."""
    logits = logits.double()
    if logits.shape[0] != targets.shape[0]:
        raise ValueError(f"{logits.shape[0]} positions of logits for {targets.shape[0]} targets")
    nll = torch.nn.functional.cross_entropy(logits, targets.long().to(logits.device))
    out = TextQuality(tokens=int(targets.shape[0]), perplexity=float(nll.exp()))
    if reference is not None:
        reference = reference.double()
        ref_logp, logp = reference.log_softmax(-1), logits.log_softmax(-1)
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0)
        out.kl_mean = float(kl.mean())
        out.kl_p99 = float(torch.quantile(kl, 0.99)) if kl.numel() > 1 else float(kl[0])
        out.top1 = float((reference.argmax(-1) == logits.argmax(-1)).double().mean())
    return out


def model_logits(model: torch.nn.Module, ids: torch.Tensor, window: int = 512) -> torch.Tensor:
    """Next-token logits ``[n - 1, vocab]`` (float32, CPU) of an uncompiled causal LM over ``ids`` ``[n]``, in
    non-overlapping windows of ``window`` tokens (each window starts with no context, as llama.cpp's perplexity
    does per chunk); position ``i`` predicts ``ids[i + 1]``. The last position of each window predicts the next
    window's first token from what it saw."""
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, ids.shape[0] - 1, window):
            chunk = ids[start:start + window + 1][:window].to(device).unsqueeze(0)
            logits = model(input_ids=chunk, use_cache=False).logits[0].float().cpu()
            out.append(logits[: min(window, ids.shape[0] - 1 - start)])
    return torch.cat(out)


def markdown_rows(rows: list[tuple[str, TextQuality]]) -> list[str]:
    """A markdown table of ``(label, quality)`` rows."""
    lines = ["| runner | tokens | perplexity | KL mean | KL p99 | top-1 vs float |", "|---|---:|---:|---:|---:|---:|"]
    for label, q in rows:
        kl = (f"{q.kl_mean:.2e} | {q.kl_p99:.2e} | {q.top1:.1%}" if q.kl_mean is not None else "(reference) | | ")
        lines.append(f"| {label} | {q.tokens} | {q.perplexity:.3f} | {kl} |")
    return lines


__all__ = ["EVAL_TEXT_NAME", "TextQuality", "default_text", "markdown_rows", "model_logits", "read_text",
           "text_quality", "token_ids"]
