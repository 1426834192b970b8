"""``precompile_step`` on a torchao-quantized model: one frame, no guard tree per call, the watch standing in
for the quantized weights' guards (which torch cannot serialize), a swapped weight leaving the frame."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk

pytest.importorskip("torchao")


def _model(scheme: str = "w8a8") -> torch.nn.Module:
    from superkernel.tools.quantize import quantize_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64)).eval()
    model.requires_grad_(False)
    quantize_model(model, scheme, group_size=32 if scheme == "int4-weight" else None)
    sk.apply_scopes(model, {"mlp": ["0", "1", "2"]})
    return model


@pytest.mark.parametrize("scheme", ["w8a8", "int4-weight", "w4a8"])
def test_a_quantized_step_is_one_precompiled_frame_and_leaves_it_when_a_weight_is_swapped(scheme):
    """int4-weight too: torchao binds its linears' ``extra_repr`` under another function's name, which Dynamo's
    guard serializer could not look up (a 24-layer int4 benchmark died on it in precompile_step)."""
    model = _model(scheme)
    x = torch.randn(1, 64)

    def step(inp):
        return model(inp)

    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    with torch.no_grad():
        eager = model(x)
        compiled = sk.precompile_step(step, (x,), cfg)
        outs = [compiled(x) for _ in range(4)]
        assert all(torch.equal(o, eager) for o in outs)  # reduce-overhead: eager's bits
        assert compiled.guard_path == "precompiled" and compiled.unguarded_subclass_guards > 0
        assert compiled.counters["guard_checks"] == 1 and not compiled.counters["fallback_calls"]

        swapped = model[2].weight
        model[2].weight = torch.nn.Parameter(swapped.detach().clone(), requires_grad=False)
        assert torch.equal(compiled(x), model(x))
        assert compiled.counters["fallback_calls"] == 1
        assert "does not guard its tensor-subclass (quantized) weights" in compiled.last_violation


def test_quantized_linears_print_their_weight_class():
    assert "weight=Int8Tensor" in repr(_model()[0])
    assert "weight=Int4" in repr(_model("int4-weight")[0])


def test_a_quantized_step_whose_state_cannot_be_watched_says_it_runs_the_guarded_path(monkeypatch):
    """Without a watch nothing vouches for the quantized weights between calls: every call after the first
    leaves the frame, and the step says so (it said "precompiled-frame-guards" before, a path it never ran)."""
    from superkernel.static_kernel import watch

    monkeypatch.setattr(watch, "MAX_OBJECTS", 3)  # (a real model past 50,000 reachable objects, in small)
    model = _model()
    x = torch.randn(1, 64)

    def step(inp):
        return model(inp)

    with torch.no_grad():
        compiled = sk.precompile_step(step, (x,), sk.CompilerConfig.from_dict({"mode": "reduce-overhead"}))
        outs = [compiled(x) for _ in range(3)]
        assert all(torch.equal(o, model(x)) for o in outs)
    assert compiled.guard_path == "full-guards" and compiled.counters["fallback_calls"] == 2
