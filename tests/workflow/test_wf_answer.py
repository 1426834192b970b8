"""The optimize report's real answer (tools/advisor/answer.py) on the real model smollm2-135m: the chat question
prefilled into the run's own cache, decoded greedily by a step, the cache put back after. The steps here are
eager ones (and one altered on purpose): this checks the answer's bookkeeping; the compiled plan's answer is
what `superkernel optimize --model smollm2-135m` writes (docs/real_models.md)."""

from __future__ import annotations

import pytest
import torch

from superkernel.tools.advisor.answer import Answer, real_answer, report_lines
from superkernel.tools.decode import prepare
from superkernel.tools.models import load_model


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_model("smollm2-135m", seed=0, device="cpu")
    session = prepare(loaded.model, prompt_len=32, steps=32, warmup=4, seed=0, device="cpu")
    return loaded, session


def _cache_tensors(session):
    return [t.clone() for layer in session.cache.layers for t in (layer.keys, layer.values)]


def test_eager_answers_tokyo_and_the_cache_is_put_back(smollm2):
    loaded, session = smollm2
    before = _cache_tensors(session)
    answer = real_answer(loaded.tokenizer(), session, session, session.step_fn(), "eager")
    assert answer.error is None and answer.same and answer.tokens > 2
    assert "Tokyo" in answer.eager_text and answer.plan_text == answer.eager_text
    after = _cache_tensors(session)
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # the run's decode state is untouched


def test_a_step_that_picks_other_tokens_is_reported_as_such(smollm2):
    loaded, session = smollm2
    eager = session.step_fn()
    calls = []

    def altered(ids, pos):
        logits = eager(ids, pos).clone()
        calls.append(1)
        if len(calls) == 2:  # the second decode step: push another token to the top
            logits[:, int(loaded.tokenizer().convert_tokens_to_ids("Paris"))] = logits.max() + 10
        return logits

    answer = real_answer(loaded.tokenizer(), session, session, altered, "altered / max-autotune")
    assert answer.error is None and not answer.same and answer.plan_text != answer.eager_text
    text = "\n".join(report_lines(answer))
    assert "| `altered / max-autotune` |" in text and "other tokens" in text


def test_no_room_in_the_cache_says_so(smollm2):
    loaded, _ = smollm2
    small = prepare(loaded.model, prompt_len=4, steps=2, warmup=1, seed=0, device="cpu")
    answer = real_answer(loaded.tokenizer(), small, small, small.step_fn(), "x / reduce-overhead")
    assert answer.error is not None and "no room to answer" in answer.error
    assert "Not generated: " in "\n".join(report_lines(answer))


def test_a_model_without_chat_template_has_no_answer():
    assert real_answer(None, None, None, None, "x") is None
    assert report_lines(None) == []
    assert report_lines(Answer("q", "p", error="why")) == ["## A real answer", "", "Not generated: why.", ""]
