"""A tiny Hugging Face Llama decode step (static KV cache) through the backend."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.hf_cache_names import cache_keyword

transformers = pytest.importorskip("transformers")

PROMPT_LEN, MAX_CACHE, STEPS = 6, 16, 3


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def decode_logits(model, step_fn):
    """Prefill uncompiled, then STEPS teacher-forced decode steps through step_fn."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE)
    prompt = torch.arange(PROMPT_LEN).unsqueeze(0) + 3
    logits = []
    with torch.no_grad():
        model(input_ids=prompt, cache_position=torch.arange(PROMPT_LEN), use_cache=True, **{cache_keyword(model): cache})
        for i in range(STEPS):
            ids = torch.tensor([[10 + i]])
            pos = torch.tensor([PROMPT_LEN + i])
            logits.append(step_fn(ids, pos, cache))
    return logits


def step_of(model):
    def step(ids, pos, cache):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_keyword(model): cache}).logits
    return step


def run_plan(model, mode, run_eagerly=False, inductor=None):
    cfg = sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}, "inductor": inductor or {}})
    fn = sk.compile(step_of(model), cfg)
    return decode_logits(model, fn), fn


@pytest.fixture()
def scoped_llama(llama):
    sk.apply_scopes(llama, {"decode_layers": "model.layers.*"})
    yield llama
    sk.remove_scopes(llama)


def test_reduce_overhead_decode_is_bit_exact(scoped_llama):
    ref, _ = run_plan(scoped_llama, "reduce-overhead", run_eagerly=True)
    ro, fn = run_plan(scoped_llama, "reduce-overhead")
    assert len(ro) == STEPS
    for a, b in zip(ro, ref):
        assert torch.equal(a, b)
    eager = decode_logits(scoped_llama, step_of(scoped_llama))
    # and the eager model's own bits: transformers' one-token GQA attention takes its eager branch
    # (pack_gqa) while a reduce-overhead compile traces (pipeline/tracing.py)
    for a, b in zip(ro, eager):
        assert torch.equal(a, b)
    ex = sk.explain(fn)
    assert ex.graph_breaks == 0 and len(ex.graphs) == 1
    assert [s.name for s in ex.segments] == ["decode_layers"]
    assert ex.segments[0].realization == "cpu-native" and ex.segments[0].num_ops > 50


@pytest.mark.slow
def test_max_autotune_decode_within_tolerance(scoped_llama):
    ref, _ = run_plan(scoped_llama, "reduce-overhead", run_eagerly=True)
    # frozen weights, without timing the plain variant against them and without C++ GEMM templates: one Inductor
    # compile of the layers instead of three kinds (the default's choices are tested where they are made:
    # freezing "auto" in test_realize_cpu.py and test_shared_kernels.py, GEMM templates in test_autotune_builds.py,
    # test_frozen_code.py and test_gemm_timing.py, all of them on one model in the e2e optimize run)
    ma, fn = run_plan(scoped_llama, "max-autotune", inductor={"freezing": True, "gemm_templates": False})
    for a, b in zip(ma, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert [s.realization for s in sk.explain(fn).segments] == ["inductor-cpp+frozen"]

