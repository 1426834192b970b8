"""``model.generate()`` with a superkernel plan: the same greedy tokens as eager, compiled once."""

from __future__ import annotations

import pytest
import torch

import superkernel
from superkernel.tools import generate_guards
from superkernel.tools.generate import apply_for_generate, remove_for_generate

from .wf_helpers import run_cli


def _generate(model, prompt, n=6, **kwargs):
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, **kwargs)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _check_same_tokens(model, vocab, strategy="decoder_layer", mode="reduce-overhead", guards=(3, 7)):
    prompt = torch.randint(0, vocab, (1, 5), generator=torch.Generator().manual_seed(1))
    eager = _generate(model, prompt, cache_implementation="static", disable_compile=True)
    torch._dynamo.reset()
    try:
        apply_for_generate(model, strategy, mode=mode)
        before = _graphs()
        first = _generate(model, prompt)
        after_first = _graphs()
        second = _generate(model, prompt)                 # a new StaticCache: must not recompile
        assert after_first > before, "generate() did not compile its decode step"
        assert _graphs() == after_first, "the second generate() compiled again"
        assert torch.equal(first, eager) and torch.equal(second, eager)
        # 5 decode steps a generate(): guards checked until a step compiles nothing (the first two, then the new
        # cache's first), skipped on the 7 others; a step with a graph break: all 10 checked
        assert generate_guards.counts(model) == guards
        backend = model.generation_config.compile_config.backend
        assert superkernel.explain(backend).segments, "the decode step was not run by the superkernel backend"
    finally:
        remove_for_generate(model)
        torch._dynamo.reset()
    assert model.generation_config.compile_config is None


def test_generate_llama_tiny_same_tokens_as_eager(llama):
    _check_same_tokens(llama.model, llama.model.config.vocab_size)


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_generate_other_architectures_same_tokens_as_eager(arch):
    from superkernel.tools.models.archs import build

    model = build(arch)
    _check_same_tokens(model, model.config.vocab_size)


def test_generate_plan_dict_and_mode_override(llama):
    model = llama.model
    plan = {"mode": "max-autotune", "scopes": {"attention": ["model.layers.*.self_attn"]}}
    try:
        apply_for_generate(model, plan, mode="reduce-overhead")
        backend = model.generation_config.compile_config.backend
        assert backend.config.mode == "reduce-overhead"
        assert model.generation_config.cache_implementation == "static"
    finally:
        remove_for_generate(model)


def test_generate_bad_input_is_one_clear_error(llama):
    with pytest.raises(ValueError, match="needs a mode"):
        apply_for_generate(llama.model, "decoder_layer")
    with pytest.raises(ValueError, match="neither a plan file nor a strategy.*decoder_layer"):
        apply_for_generate(llama.model, "decoder-layers", mode="reduce-overhead")
    with pytest.raises(ValueError, match="mode must be one of"):
        apply_for_generate(llama.model, "attention", mode="fast")


def test_bench_report_needs_generate(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("version: 1\nmodel: llama-tiny\nmode: reduce-overhead\nscopes:\n  a: [model.layers.*]\n")
    result = run_cli("bench", "--config", str(plan), "--report", str(tmp_path / "r.md"))
    assert result.code == 2 and "--report goes with --generate" in result.err


def test_generate_turns_the_cache_on_where_the_config_turns_it_off():
    """MPT's config says ``use_cache=False``: generate() would ignore the static cache, skip
    compilation and the plan would do nothing; with the plan it compiles, and removing the
    plan puts the config's choice back."""
    from superkernel.tools.models.registry import build_tiny

    model = build_tiny("mpt")
    assert model.generation_config.use_cache is False
    # asserts the decode step was compiled by superkernel; MPT's step breaks the graph: every step's guards checked
    _check_same_tokens(model, model.config.vocab_size, guards=(10, 0))
    assert model.generation_config.use_cache is False


def test_a_call_that_grows_the_cache_gets_a_power_of_two_so_later_calls_rarely_compile_again(llama):
    """5 + 6 tokens: transformers' 10 positions; again: no compile. 5 + 8 (12 > 10: compiles anyway) gets 16, so
    5 + 7 and 5 + 12 (16) compile nothing; 5 + 13 (17) compiles once more, at 32. Every call gives eager's tokens.
    ``max_cache_len=40`` sizes every call up to 40 positions alike. Removing the plan gives transformers' lengths
    and the generation config back."""
    from superkernel.tools.generate_cache import bucket

    assert [bucket(n) for n in (1, 10, 16, 17, 69)] == [1, 16, 16, 32, 128]
    assert bucket(69, ceiling=100) == 100 and bucket(200, ceiling=100) == 256 and bucket(64, ceiling=64) == 64
    model = llama.model
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    lengths = (6, 8, 7, 12, 13)
    eager = {n: _generate(model, prompt, n, cache_implementation="static", disable_compile=True) for n in lengths}
    model.__dict__.pop("_previous_max_cache_length", None)  # transformers' longest so far (the shared model's)
    torch._dynamo.reset()
    try:
        apply_for_generate(model, "decoder_layer", mode="reduce-overhead")
        compiled = []
        for n in (6, 6, 8, 7, 12, 13, 6):
            assert torch.equal(_generate(model, prompt, n), eager[n]), n
            compiled.append(_graphs())
        assert compiled[1] == compiled[0] < compiled[2] == compiled[3] == compiled[4] < compiled[5] == compiled[6]
        assert model._previous_max_cache_length == 32
        with pytest.raises(ValueError, match="max_cache_len must be a positive number of positions, got 0"):
            apply_for_generate(model, "decoder_layer", mode="reduce-overhead", max_cache_len=0)
        torch._dynamo.reset()
        model.__dict__.pop("_previous_max_cache_length", None)
        apply_for_generate(model, "decoder_layer", mode="reduce-overhead", max_cache_len=40)
        assert torch.equal(_generate(model, prompt, 6), eager[6])
        compiled = _graphs()
        assert torch.equal(_generate(model, prompt, 13), eager[13]) and _graphs() == compiled
    finally:
        remove_for_generate(model)
        torch._dynamo.reset()
    assert "_prepare_static_cache" not in model.__dict__ and model.generation_config.max_cache_len is None


def test_a_repeated_call_skips_the_guards_a_new_signature_is_checked():
    """Our bookkeeping of guarded calls (a plain function stands in for the compiled step: what is tested is which
    calls run under ``skip_guard_eval_unsafe``, read from Dynamo's own stance)."""
    import gc

    from torch._dynamo import eval_frame

    from superkernel.tools.generate_guards import GuardedOncePerSignature

    class Cache:
        pass

    stances = []
    step = GuardedOncePerSignature(lambda *a, **k: stances.append(eval_frame._stance.skip_guard_eval_unsafe))
    cache = Cache()
    x = torch.zeros(1, 1, dtype=torch.long)
    mask = {"full_attention": torch.ones(1, 1, 1, 8)}
    for args in [(x,), (x + 1,), (torch.zeros(1, 2, dtype=torch.long),), (x.float(),), (x,)]:
        step(*args, past_key_values=cache, attention_mask=dict(mask), use_cache=True)
    assert stances == [False, True, False, False, True]
    step(x, past_key_values=Cache(), attention_mask=mask, use_cache=True)  # a new cache (freed after the call) ...
    gc.collect()
    step(x, past_key_values=cache, attention_mask=mask, use_cache=True)  # ... made every signature forgotten
    step(x, past_key_values=cache, attention_mask={"full_attention": torch.ones(1, 1, 1, 9)}, use_cache=True)
    step(x, past_key_values=cache, attention_mask=mask, use_cache=False)
    step(x, past_key_values=object(), attention_mask=mask, use_cache=True)  # not weakly referenceable: ...
    step(x, past_key_values=object(), attention_mask=mask, use_cache=True)  # ... never skipped
    with torch.no_grad():
        step(x, past_key_values=cache, attention_mask=mask, use_cache=True)
    assert stances[5:] == [False, False, False, False, False, False, False]
    assert (step.checked, step.skipped) == (10, 2)
