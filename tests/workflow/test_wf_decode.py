"""Decode harness: prefill once, teacher-forced steps, cache restore, statistics."""

from __future__ import annotations

import pytest
import torch

from superkernel.tools.decode import DecodeRun, prepare, run_decode


def test_session_shapes_and_teacher_tokens(llama_session):
    s = llama_session
    assert s.prompt_ids.shape == (1, 8)
    assert s.tokens.shape == (s.warmup + s.steps, 1)  # [steps, batch]
    assert s.max_cache_len == 8 + s.warmup + s.steps + 1  # one spare slot (see prepare)
    assert all(layer.keys.shape[2] == s.max_cache_len for layer in s.cache.layers)  # preallocated
    assert s.prefill_seconds > 0


def test_tokens_are_the_eager_greedy_sequence(llama_session):
    run = run_decode(llama_session, llama_session.step_fn())
    # step i is fed tokens[i]; greedy means its argmax is the token fed at step i + 1
    assert torch.equal(run.logits.argmax(-1)[:-1], llama_session.tokens[1:].reshape(-1).cpu())


def test_every_run_starts_from_the_same_cache_state(llama_session):
    first = run_decode(llama_session, llama_session.step_fn())
    second = run_decode(llama_session, llama_session.step_fn())
    assert torch.equal(first.logits, second.logits)
    # and a run that feeds something else does not leak into the next one
    base = llama_session.step_fn()
    run_decode(llama_session, lambda ids, pos: base(torch.zeros_like(ids), pos))
    assert torch.equal(run_decode(llama_session, llama_session.step_fn()).logits, first.logits)


def test_compiled_step_is_fed_the_same_inputs(llama_session):
    eager = run_decode(llama_session, llama_session.step_fn())
    compiled = run_decode(llama_session, torch.compile(llama_session.step_fn(), backend="eager", dynamic=False))
    assert compiled.logits.shape == eager.logits.shape
    torch.testing.assert_close(compiled.logits, eager.logits, rtol=0, atol=1e-5)


def test_statistics_exclude_warmup():
    times = [10.0, 0.001, 0.002, 0.003, 0.004, 0.010]
    run = DecodeRun(label="x", logits=torch.zeros(6, 2), step_seconds=times, warmup=1, compile_seconds=10.0)
    assert run.median_ms == pytest.approx(3.0)
    assert run.p90_ms == pytest.approx(7.6)  # linear interpolation between 4 ms and 10 ms
    assert run.tokens_per_s == pytest.approx(1000 / 3.0)


def test_bad_lengths_are_rejected(llama):
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        prepare(llama.model, prompt_len=4, steps=2, warmup=0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        prepare(llama.model, prompt_len=4000, steps=2, warmup=1)


def _counted(calls):
    """DynamoCounts for ``calls`` run as first call / warm-up / timed, as run_decode marks them."""
    from superkernel.tools.decode import DynamoWatch

    with DynamoWatch() as watch:
        for call in calls:
            call()
            watch.mark()
    return watch.counts()


def _own_frame(k):
    """A function with a code object of its own (a lambda made in a loop shares one). Its source is
    registered with linecache: torch 2.11 wraps a function without a source file in one shared code
    object (``external_utils.wrap_inline``), which would give all of them one recompile limit."""
    import linecache

    scope: dict = {}
    text = f"def times_{k}(t):\n    return t * {k}\n"
    linecache.cache[f"<frame {k}>"] = (len(text), None, text.splitlines(True), f"<frame {k}>")
    exec(compile(text, f"<frame {k}>", "exec"), scope)
    return scope[f"times_{k}"]


def test_recompile_limit_is_what_dynamo_says_not_a_count_of_guard_failures():
    torch._dynamo.reset()
    limit = 3
    x = torch.ones(2)
    try:
        with torch._dynamo.config.patch(recompile_limit=limit, automatic_dynamic_shapes=False):
            # many frames, each failing its guards once: not the limit
            fns = [torch.compile(_own_frame(k), backend="eager") for k in range(2 * limit)]
            spread = _counted([lambda: [f(x) for f in fns],
                               lambda: [f(torch.ones(i + 3)) for i, f in enumerate(fns)], lambda: None])
            assert not spread.limit_hit
            # one frame recompiled past its limit: Dynamo gives up on it
            one = torch.compile(lambda t: t + 1, backend="eager")
            hit = _counted([lambda: one(x), lambda: [one(torch.ones(n)) for n in range(3, 4 + limit)],
                            lambda: None])
            assert hit.limit_hit
            # one frame with entries enough that its guard failures, one per entry checked,
            # reach the limit while its entries do not: Dynamo compiles it (the MPT CI failure)
            own = _own_frame(99)
            grows = torch.compile(own, backend="eager")
            grows(x)
            filled = _counted([lambda: [grows(torch.ones(n)) for n in range(3, 3 + limit - 1)], lambda: None,
                               lambda: None])
            assert len(torch._dynamo.utils.guard_failures[own.__code__]) >= limit
            assert not filled.limit_hit
    finally:
        torch._dynamo.reset()
