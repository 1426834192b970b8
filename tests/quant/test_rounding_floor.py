"""W8A8's rounding floor (tools/advisor/rounding_floor.py): what it perturbs, what it measures, how it widens the gate."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from superkernel.tools.advisor.precision import (DTYPE_TOLERANCE, QUANTIZATION_TAG, W8A8_TOLERANCE,  # noqa: E402
                                                 default_tolerance, measures_floor)
from superkernel.tools.advisor.rounding_floor import (RoundingFloor, embeddings_one_ulp_off,  # noqa: E402
                                                      one_ulp_off, rounding_floor)


def test_one_ulp_off_moves_every_element_to_a_neighbouring_float():
    t = torch.randn(4096) * 10
    moved = one_ulp_off(t, torch.Generator().manual_seed(0))
    up = torch.nextafter(t, torch.full_like(t, float("inf")))
    down = torch.nextafter(t, torch.full_like(t, float("-inf")))
    assert bool(((moved == up) | (moved == down)).all()) and not bool((moved == t).any())
    assert 0.4 < float((moved == up).double().mean()) < 0.6  # both ways, at random
    bf16 = torch.randn(64, dtype=torch.bfloat16)
    assert one_ulp_off(bf16, torch.Generator().manual_seed(0)).dtype == torch.bfloat16


def test_the_floor_widens_the_w8a8_gate_only():
    model = torch.nn.Linear(2, 2)
    floor = RoundingFloor(max_abs=0.3, relative=0.04, top1_agreement=1.0, perturbed="Embedding")
    small = RoundingFloor(max_abs=0.01, relative=0.01, top1_agreement=1.0, perturbed="Embedding")
    assert default_tolerance(model, floor) == DTYPE_TOLERANCE["float32"] and not measures_floor(model)
    setattr(model, QUANTIZATION_TAG, "w8a8")
    assert measures_floor(model)
    assert default_tolerance(model) == W8A8_TOLERANCE
    assert default_tolerance(model, small) == W8A8_TOLERANCE       # the least W8A8 tolerance stands
    assert default_tolerance(model, floor) == pytest.approx(0.08)  # two floors
    setattr(model, QUANTIZATION_TAG, "int8-weight")
    assert default_tolerance(model, floor) == DTYPE_TOLERANCE["float32"]


def test_the_floor_is_w8a8s_amplification_of_one_ulp_and_leaves_the_model_as_it_was():
    """On llama-tiny one ulp at the embeddings moves float32 logits by rounding (~1e-6 of their scale) and W8A8's
    by int8 steps (~1e-2): the floor measures the scheme's own sensitivity. The hook is gone afterwards."""
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models import load_model
    from superkernel.tools.quantize import quantize_model

    floors = {}
    for scheme in ("float32", "w8a8"):
        model = load_model("llama-tiny").model
        if scheme != "float32":
            quantize_model(model, scheme)
        session = prepare(model, prompt_len=8, steps=6, warmup=1)
        eager = run_decode(session, session.step_fn()).logits
        floors[scheme] = rounding_floor(session, eager)
        assert torch.equal(run_decode(session, session.step_fn()).logits, eager)  # the hook was removed
        scale = max(1.0, float(eager.abs().max()))
        assert floors[scheme].relative == pytest.approx(floors[scheme].max_abs / scale)
    assert floors["float32"].relative < 1e-4
    assert floors["w8a8"].relative > 100 * max(floors["float32"].relative, 1e-7)


def test_a_model_without_input_embeddings_is_refused_by_name():
    with pytest.raises(ValueError, match="Linear has no input embeddings module to perturb"):
        with embeddings_one_ulp_off(torch.nn.Linear(2, 2)):
            pass


def test_a_floor_that_cannot_be_measured_leaves_the_fixed_w8a8_gate(capsys):
    """measure_floor (run_baselines' step for a W8A8 model) notes why and returns None: no stack trace, the
    fixed W8A8 tolerance judges."""
    import types

    from superkernel.tools.advisor.measure import measure_floor
    from superkernel.tools.advisor.progress import Reporter

    session = types.SimpleNamespace(model=torch.nn.Linear(2, 2))
    assert measure_floor(session, torch.zeros(1, 4), Reporter()) is None
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())  # the console wraps lines
    assert "W8A8 rounding floor not measured (ValueError: Linear has no input embeddings module" in said
