"""The workflow's quality section: every plan and baseline scored on real text (issue 58).

A model with a tokenizer (a checkpoint with tokenizer files, a GGUF file, ``smollm2-135m``) is decoded over a
real text instead of its own greedy continuation: the prompt is the text's first tokens and every decode step
is fed the text's next token, so each run's logits (which the workflow keeps anyway) score against the text at
no extra step. The reference of KL and top-1 is the float model's eager decode over the same tokens: eager
itself, or for ``--quantize`` the model before quantization. Eager (and the float model) are also scored over
the whole text in one uncompiled forward, for a perplexity over more tokens than the decode steps.
Random-weight zoo models have no tokenizer: no section (their perplexity would mean nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from superkernel.tools.quality import TextQuality, markdown_rows, model_logits, read_text, text_quality, token_ids


@dataclass
class TextEval:
    name: str                                    # the text: "--eval-text" path or the shipped text's name
    ids: torch.Tensor                            # its token ids [n]
    float_decode: torch.Tensor | None = None     # the float model's decode logits, when the model was quantized
    whole: dict[str, TextQuality] = field(default_factory=dict)  # uncompiled forward over the whole text


def text_for(eval_text: Path | None, loaded: Any) -> TextEval | None:
    """The evaluation text of this run, tokenized by the model's tokenizer; None for a model without one.
    ``--eval-text`` with a model that has no tokenizer is a usage error (ValueError)."""
    tokenizer = loaded.tokenizer() if getattr(loaded, "tokenizer_dir", None) is not None else None
    if tokenizer is None:
        if eval_text is not None:
            raise ValueError(f"--eval-text needs a model with a tokenizer (a checkpoint with tokenizer files or a GGUF "
                             f"file); {loaded.name} has none")
        return None
    name, text = read_text(eval_text)
    return TextEval(name=name, ids=token_ids(tokenizer, text))


def score_whole_text(text: TextEval, model: torch.nn.Module, float_model: torch.nn.Module | None) -> None:
    """Eager perplexity over the whole text (and KL from the float model when ``float_model`` is given)."""
    targets = text.ids[1:]
    logits = model_logits(model, text.ids)
    reference = model_logits(float_model, text.ids) if float_model is not None else logits
    if float_model is not None:
        text.whole["float eager"] = text_quality(reference, targets, reference)
    text.whole["eager"] = text_quality(logits, targets, reference)


def first_sequence(logits: torch.Tensor, session: Any) -> torch.Tensor:
    """Rows of sequence 0 from step-major ``[(steps) * batch, vocab]`` logits (every sequence reads the same text)."""
    return logits.reshape(session.total_steps, session.batch, -1)[:, 0]


def score_runs(text: TextEval, session: Any, results: list[Any]) -> dict[str, Any]:
    """Quality of every run with logits over the decode steps, and the whole-text rows: results.json's ``quality``."""
    targets = session.text_targets
    eager = next((r for r in results if r.name == "eager" and r.logits is not None), None)
    reference = text.float_decode if text.float_decode is not None else (eager.logits if eager is not None else None)
    if reference is None or targets is None:
        return {}
    reference = first_sequence(reference, session)
    decode: dict[str, TextQuality] = {}
    if text.float_decode is not None:
        decode["float eager"] = text_quality(reference, targets, reference)
    for r in results:
        if r.logits is not None and not r.error:
            decode[r.name] = text_quality(first_sequence(r.logits, session), targets, reference)
    return {"text": text.name, "text_tokens": int(text.ids.shape[0]),
            "reference": "the float model before quantization" if text.float_decode is not None else "eager",
            "decode": {k: v.to_dict() for k, v in decode.items()},
            "whole_text": {k: v.to_dict() for k, v in text.whole.items()}}


def report_lines(quality: dict[str, Any] | None) -> list[str]:
    """The report's "Quality on real text" section (empty without a text)."""
    if not quality:
        return []
    rows = [(f"`{k}`", TextQuality(**v)) for k, v in quality["decode"].items()]
    whole = [(f"{k}, whole text", TextQuality(**v)) for k, v in quality["whole_text"].items()]
    return ["## Quality on real text", "",
            f"Every run decoded the text *{quality['text']}* ({quality['text_tokens']} tokens) teacher-forced: "
            "perplexity of the text's next tokens, KL divergence from the reference "
            f"({quality['reference']}; nats per position, mean and 99th percentile) and the share of positions "
            "whose top-1 token equals the reference's — the figures llama.cpp's perplexity tool reports. Decode rows "
            "cover the warm-up and timed steps; the whole-text rows are one uncompiled forward over every token.", "",
            *markdown_rows(rows + whole), ""]


__all__ = ["TextEval", "first_sequence", "report_lines", "score_runs", "score_whole_text", "text_for"]
