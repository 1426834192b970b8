"""Every kind of cache layer a transformers StaticCache holds is snapshotted and restored exactly.

One generated tiny architecture per layer class (full, sliding window, indexed, recurrent /
linear-attention state, linear attention combined with full or sliding attention): two eager
decodes from the restored cache give identical logits. A new static layer class in
transformers fails the coverage test until a case is added here.
"""

from __future__ import annotations

import pytest
import torch

from superkernel.tools.decode import prepare, run_decode
from superkernel.tools.models.registry import build_tiny

#: layer class StaticCache builds -> a model type whose tiny config builds it
CASES = {
    "StaticLayer": "llama",
    "StaticSlidingWindowLayer": "mistral",
    "StaticIndexedLayer": "hy_v4",
    "LinearAttentionLayer": "mamba",
    "LinearAttentionAndStaticFullAttentionLayer": "falcon_h1",
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": "inkling_text",
}


def test_every_static_layer_class_of_transformers_has_a_case():
    import inspect

    import transformers.cache_utils as cu

    static = {name for name, cls in inspect.getmembers(cu, inspect.isclass)
              if cls.__module__ == cu.__name__ and "Static" in name and "Cache" not in name}
    assert static <= set(CASES), f"cache layer classes without a case: {sorted(static - set(CASES))}"


@pytest.mark.parametrize("layer_kind", sorted(CASES))
def test_two_eager_decodes_from_the_restored_cache_are_identical(layer_kind):
    session = prepare(build_tiny(CASES[layer_kind]), prompt_len=20, steps=3, warmup=1, seed=0)
    assert layer_kind in {type(layer).__name__ for layer in session.cache.layers}
    first = run_decode(session, session.step_fn())
    second = run_decode(session, session.step_fn())
    assert torch.equal(first.logits, second.logits)
    assert torch.equal(first.logits.argmax(-1)[:-1], session.tokens[1:].reshape(-1).cpu())


def test_the_decode_leaves_one_cache_slot_free_unless_asked_not_to():
    model = build_tiny("biogpt")
    assert prepare(model, prompt_len=8, steps=2, warmup=1).max_cache_len == 8 + 2 + 1 + 1
    assert prepare(model, prompt_len=8, steps=2, warmup=1, spare_slots=0,
                   reference_tokens=False).max_cache_len == 8 + 2 + 1
