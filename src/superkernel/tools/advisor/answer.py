"""The optimize report's real answer: the recommended plan answering a chat question, beside eager.

A model with a tokenizer and a chat template (SmolLM2-135M-Instruct; not the random-weight zoo models) is
asked :data:`QUESTION`. The prompt is prefilled uncompiled into the run's own preallocated cache, then
decoded greedily twice: by the eager step and by the recommended plan's compiled step — the very step the
run measured, on its own copy of the model and cache, so nothing is compiled again. Both caches are put back
to the run's state afterwards. reduce-overhead plans must give eager's text exactly (binary fusion);
max-autotune plans pass a tolerance, so their text may part from eager's where two tokens are close.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

#: The question the report's answer is to (the one the GGUF tests ask SmolLM2).
QUESTION = "What is the capital of Japan?"
#: At most this many new tokens (fewer where the run's cache has less room, or at the end-of-sequence token).
NEW_TOKENS = 24


@dataclass
class Answer:
    question: str
    plan: str                     # the plan's name ("decoder_layer / max-autotune")
    eager_text: str = ""
    plan_text: str = ""
    tokens: int = 0               # new tokens eager generated
    same: bool = False            # the plan's token ids equal eager's
    error: str | None = None      # why there is no answer (no chat template, no room in the cache, ...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, question: str = QUESTION) -> torch.Tensor | None:
    """The chat prompt's token ids ``[1, n]``, or None when the tokenizer has no chat template."""
    if not has_chat_template(tokenizer):
        return None
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=False)
    if not isinstance(ids, torch.Tensor):  # some versions return a BatchEncoding-like mapping
        ids = ids["input_ids"]
    return ids.reshape(1, -1)


def greedy(session: Any, step: Callable[..., torch.Tensor], prompt: torch.Tensor, new_tokens: int,
           eos: int | None) -> list[int]:
    """Prefill ``prompt`` uncompiled into ``session``'s cache, decode greedily with ``step``; the cache is put
    back to the session's state after."""
    model, device = session.model, session.device
    prompt = prompt.to(device)
    length = prompt.shape[1]
    out: list[int] = []
    try:
        with torch.no_grad(), session.dynamo_config():
            # empty, in place (compiled steps keep the tensors' addresses): transformers' static layers write at their
            # own running length, not at cache_position
            session.cache.reset()
            position = torch.arange(length, device=device)
            logits = model(input_ids=prompt, cache_position=position, use_cache=True,  # as the run's prefill
                           **{session.cache_kwarg: session.cache}).logits[:, -1, :]
            token = int(logits.argmax(-1)[0])
            for i in range(new_tokens):
                out.append(token)
                if token == eos or i == new_tokens - 1:
                    break
                logits = step(torch.tensor([[token]], device=device), torch.tensor([length + i], device=device))
                token = int(logits.argmax(-1)[0])
    finally:
        session.restore_cache()
    return out


def real_answer(tokenizer: Any, session: Any, plan_session: Any, plan_step: Callable[..., torch.Tensor],
                plan_name: str, *, question: str = QUESTION, new_tokens: int = NEW_TOKENS) -> Answer | None:
    """Eager's and the plan's greedy answer to ``question``; None for a model without a chat template."""
    prompt = chat_ids(tokenizer, question)
    if prompt is None:
        return None
    answer = Answer(question=question, plan=plan_name)
    room = session.max_cache_len - prompt.shape[1]
    if session.batch != 1:
        answer.error = f"the run decodes a batch of {session.batch}; the answer is generated at batch 1 only"
        return answer
    if room < 2:
        answer.error = (f"the chat prompt has {prompt.shape[1]} tokens and the run's cache holds "
                        f"{session.max_cache_len}: no room to answer (a longer --prompt-len or more --steps makes room)")
        return answer
    eos = getattr(tokenizer, "eos_token_id", None)
    try:
        eager = greedy(session, session.step_fn(), prompt, min(new_tokens, room), eos)
        planned = greedy(plan_session, plan_step, prompt, min(new_tokens, room), eos)
    except Exception as exc:  # an answer that cannot be generated is reported, never fatal for the run
        from superkernel.util import exception_summary

        answer.error = f"generating failed: {exception_summary(exc, 240)}"
        return answer
    answer.tokens, answer.same = len(eager), planned == eager
    answer.eager_text = tokenizer.decode(eager, skip_special_tokens=True).strip()
    answer.plan_text = tokenizer.decode(planned, skip_special_tokens=True).strip()
    return answer


def report_lines(answer: Answer | None) -> list[str]:
    """The report's section (empty without an answer)."""
    if answer is None:
        return []
    lines = ["## A real answer", ""]
    if answer.error:
        return lines + [f"Not generated: {answer.error}.", ""]
    verdict = ("the same tokens" if answer.same else
               "other tokens (max-autotune passes a tolerance: where two tokens are close the text may part)")
    lines += [f"Asked *{answer.question}* (the model's chat template; greedy, at most {NEW_TOKENS} new tokens, the "
              f"prompt prefilled uncompiled, then decoded by each step of this run):", "",
              "| decoded by | answer |", "|---|---|",
              f"| eager | {_cell(answer.eager_text)} |",
              f"| `{answer.plan}` | {_cell(answer.plan_text)} |", "",
              f"The plan gave {verdict}.", ""]
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "(empty)"
