"""The analysis traces the model once: every other plan's trial is read from the first capture's graph
(superkernel.pipeline.relabel), and must be exactly what that plan's own capture gives."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

import superkernel
from superkernel.tools.advisor.analysis import analyze, labelled_trial, trial_capture
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure

STRATEGIES = ("attention", "mlp", "decoder_layer", "all_layers")


def _facts(trial):
    return ([asdict(s) for s in trial.segments], [asdict(c) for c in trial.cuts], trial.unscoped_ops,
            trial.total_ops, trial.graphs, trial.graph_breaks, sorted(trial.wrapped), trial.uncaptured)


def test_labelled_trials_equal_their_own_captures(llama_session):
    structure = analyze_structure(llama_session.model)
    plans = [plan_for(s, structure) for s in STRATEGIES]
    analysis = analyze("llama-tiny", llama_session, plans=plans, references=True)
    first, *rest = analysis.trials
    assert first.labelled_from is None and first.captured is None  # captured itself; the graph not kept after
    assert [t.labelled_from for t in rest] == ["attention"] * 3
    for shared in rest:
        own = trial_capture(llama_session, shared.plan, reference=True)
        assert own.error is None and own.labelled_from is None
        assert _facts(shared) == _facts(own), shared.plan.strategy
        assert torch.equal(shared.reference_logits, own.reference_logits)  # the same graph, run op by op
    segments = {t.plan.strategy: len(t.segments) for t in analysis.trials}
    assert segments["all_layers"] == 1 and segments["decoder_layer"] == 4  # the labels really differ per plan


def test_a_graph_with_scopes_of_its_own_is_captured_again(llama_session):
    """A scope written in the model's code is in the graph but no plan's module boundary: the labels cannot
    be re-read from the module stack, so the next plan is captured itself."""
    structure = analyze_structure(llama_session.model)
    first_plan, second_plan = plan_for("mlp", structure), plan_for("attention", structure)
    norm = llama_session.model.model.norm
    original = norm.forward

    def forward_in_own_scope(*args, **kwargs):
        with superkernel.super_kernel("final_norm"):
            return original(*args, **kwargs)

    norm.forward = forward_in_own_scope
    try:
        first = trial_capture(llama_session, first_plan, keep_graph=True)
        assert first.error is None and first.captured is not None
        assert labelled_trial(first, llama_session, second_plan) is None
        assert any(s.scope == "final_norm" for s in first.segments)
    finally:
        del norm.forward


@pytest.mark.parametrize("wanted", ["attention", "all_layers"])
def test_labels_for_refuses_a_module_matched_twice(llama_session, wanted):
    from superkernel.pipeline.relabel import module_labels

    model = llama_session.model
    assert module_labels(model, {"a": "model.layers.*.mlp", "b": "model.layers.0.mlp"}) is None
    assert module_labels(model, plan_for(wanted, analyze_structure(model)).scopes)


def test_the_logits_file_takes_references_shared_by_labelled_trials():
    """The shared exactness reference is one tensor under every strategy's name; safetensors refuses shared
    storage, so each name is written on its own (found by the first optimize run on SmolLM2)."""
    from types import SimpleNamespace

    from safetensors.torch import load

    from superkernel.tools.advisor.workflow import _logits_bytes

    shared = torch.arange(6.0).reshape(2, 3)
    out = load(_logits_bytes([], {"attention": shared, "mlp": shared}, SimpleNamespace(tokens=torch.zeros(2, 1))))
    assert torch.equal(out["attention / reference"], shared) and torch.equal(out["mlp / reference"], shared)
