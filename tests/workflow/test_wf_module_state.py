"""Decode state a model keeps on its modules, outside the cache, is restored with the cache.

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
