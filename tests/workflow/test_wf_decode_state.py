"""The decode state the harness must carry: state kept on modules, a cache under another keyword.

RecurrentGemma keeps its convolution and recurrent states as plain module attributes
(``conv1d_state``, ``rg_lru.recurrent_states``), reassigned every step: restoring only the
cache made two eager decodes from "the same" state differ (max abs diff 0.13).
"""

from __future__ import annotations

import torch

from superkernel.tools.cache_state import restore_module_state, snapshot_module_state
from superkernel.tools.models.eligibility import probe


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.inner.state = torch.zeros(2)          # reassigned every step
        self.steps = 0                             # a Python counter
        self.lazy = None                           # created by the first step
        self.register_buffer("running", torch.zeros(3))  # updated in place

    def step(self) -> None:
        self.inner.state = self.inner.state + 1
        self.steps += 1
        self.lazy = torch.ones(1)
        self.running.add_(2)


def test_module_attributes_and_buffers_are_restored():
    model = Stateful()
    model.step()
    running = model.running
    snap = snapshot_module_state(model)
    model.step()
    model.step()
    model.lazy = None
    restore_module_state(model, snap)
    assert torch.equal(model.inner.state, torch.ones(2)) and model.steps == 1
    assert torch.equal(model.lazy, torch.ones(1))
    assert model.running is running and torch.equal(model.running, torch.full((3,), 2.0))


def test_recurrent_state_held_on_modules_decodes_the_same_twice():
    row = probe("recurrent_gemma")
    assert row["eligible"] is True, row.get("reason")


def test_a_cache_under_another_keyword_is_passed_under_it():
    """Mamba's forward takes its cache as ``cache_params`` (transformers < 5.24) or ``cache`` (5.24 on):
    passed as ``past_key_values`` it went into ``**kwargs`` and every step decoded from an empty
    state (no error, and two runs agreed)."""
    import inspect

    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models.registry import build_tiny

    model = build_tiny("mamba")
    session = prepare(model, prompt_len=8, steps=2, warmup=1)
    takes = inspect.signature(model.forward).parameters
    assert session.cache_kwarg in ("cache_params", "cache") and session.cache_kwarg in takes
    ids, pos = session.inputs(0)
    with torch.no_grad():
        stateless = model(input_ids=ids, use_cache=False).logits[:, -1]
    decoded = run_decode(session, session.step_fn()).logits[:1]
    assert not torch.allclose(decoded, stateless)  # the prompt's state reaches the step


def test_a_model_that_ignores_the_cache_is_listed_with_where():
    row = probe("xlnet")  # decode state in `mems`; max_position_embeddings=-1 is "no limit", not an error
    assert row["eligible"] is False and row["stage"] == "prefill"
    assert "did not write the StaticCache" in row["reason"] and "modeling_xlnet.py:" in row["reason"]
