"""The decode harness restores the complete cache state for every kind of cache layer.

Two eager runs through the harness must give identical logits: any state the restore
misses (a sliding window's Python ``cumulative_length_int``, linear attention's conv and
recurrent states and ``has_previous_state`` flags, a quantized layer's int length) makes
the second run start from a different cache. Tiny configs, built on the fly.
"""

from __future__ import annotations

import pytest
import torch

from superkernel.hf_cache_names import cache_keyword
from superkernel.tools.decode import prepare, restore_state, run_decode, snapshot_state
from superkernel.tools.models.archs import build

# (arch, layer class expected in the StaticCache, prompt length): the sliding cases use a
# prompt longer than the 16-token window, so the window is full and rolls.
CASES = [
    ("llama", "StaticLayer", 8),
    ("mistral", "StaticSlidingWindowLayer", 8),        # window filling up
    ("mistral", "StaticSlidingWindowLayer", 20),       # window full: roll path
    ("gemma3_text", "StaticSlidingWindowLayer", 20),   # hybrid: sliding + full layers
    ("llama4_text", "StaticSlidingWindowLayer", 20),   # chunked attention layers
    ("qwen3_next", "LinearAttentionLayer", 8),         # linear attention (conv + recurrent state) + full
]


@pytest.mark.parametrize("arch,layer_kind,prompt_len", CASES, ids=[f"{a}-{p}" for a, _, p in CASES])
def test_eager_twice_gives_identical_logits(arch, layer_kind, prompt_len):
    model = build(arch)
    session = prepare(model, prompt_len=prompt_len, steps=3, warmup=1, seed=0)
    assert layer_kind in {type(layer).__name__ for layer in session.cache.layers}
    first = run_decode(session, session.step_fn())
    second = run_decode(session, session.step_fn())
    assert torch.equal(first.logits, second.logits)
    # and the greedy reference agrees with a third run
    assert torch.equal(first.logits.argmax(-1)[:-1], session.tokens[1:].reshape(-1).cpu())


def test_growing_python_ints_are_measured():
    session = prepare(build("mistral"), prompt_len=8, steps=2, warmup=1)
    assert session.growing_ints == ["cumulative_length_int"]
    assert "cumulative_length_int" in session.dynamic_sources
    assert prepare(build("llama"), prompt_len=8, steps=2, warmup=1).growing_ints == []


def test_restore_undoes_attributes_tensors_and_dict_entries():
    class Layer:  # stands in for any transformers cache layer: tensors, ints, dicts of tensors
        pass

    layer = Layer()
    layer.keys = torch.zeros(2, 3)
    layer.count = 4
    layer.states = {0: torch.ones(2)}
    layer.flags = {0: False}
    layer.__class__.__module__ = "transformers.cache_utils"

    class Cache:
        pass

    cache = Cache()
    cache.layers = [layer]
    keys_address = layer.keys.data_ptr()
    snap = snapshot_state(cache)
    layer.keys.add_(5)
    layer.count += 3
    layer.states[0].mul_(7)
    layer.states[1] = torch.zeros(1)
    layer.flags[0] = True
    layer.late = "lazy"
    restore_state(cache, snap)
    assert torch.equal(layer.keys, torch.zeros(2, 3)) and layer.keys.data_ptr() == keys_address  # in place
    assert layer.count == 4 and layer.flags == {0: False}
    assert list(layer.states) == [0] and torch.equal(layer.states[0], torch.ones(2))
    assert not hasattr(layer, "late")


def test_quantized_cache_state_round_trips():
    from transformers import QuantizedCache

    model = build("llama")
    try:
        cache = QuantizedCache(backend="fp8", config=model.config)
    except Exception as exc:  # backend not available in this transformers / torch build
        pytest.skip(f"fp8 QuantizedCache unavailable: {exc}")
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        try:
            model(input_ids=prompt, use_cache=True, **{cache_keyword(model): cache})
        except Exception as exc:
            pytest.skip(f"fp8 QuantizedCache does not run here: {exc}")
        snap = snapshot_state(cache)

        def steps():
            out = []
            for i in range(3):
                ids = torch.tensor([[i + 1]])
                out.append(model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache}).logits)
            return torch.cat(out)

        first = steps()
        restore_state(cache, snap)
        second = steps()
    assert torch.equal(first, second)
