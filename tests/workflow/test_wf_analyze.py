"""``superkernel analyze`` on every zoo model, and cuts with reasons from a trial capture."""

from __future__ import annotations

import json

import pytest
import torch

import superkernel
from superkernel.tools.advisor.analysis import analyze
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure

from .conftest import ZOO_NAMES, run_cli

EXPECTED_TRIALS = {
    "llama-tiny": ["attention", "mlp", "decoder_layer", "all_layers"],
    "qwen3-moe-tiny": ["attention", "moe", "decoder_layer", "all_layers"],
    "deepseek-v3-tiny": ["attention", "mlp", "moe", "decoder_layer", "all_layers"],
}


def check_zoo_analysis(name: str, data: dict, out: str) -> None:
    """What ``superkernel analyze --model NAME --json`` must report on a zoo model (``out``: its terminal output)."""
    assert data["model"] == name
    assert data["structure"]["layers_path"] == "model.layers"
    assert len(data["structure"]["layers"]) == 4
    assert data["decode_graphs"] == 1 and data["graph_breaks"] == []
    assert "preallocated" in data["kv_cache"] and "prefill" in data["prefill_decode"]
    assert [t["strategy"] for t in data["trials"]] == EXPECTED_TRIALS[name]
    assert data["issues"] == [] and "potential issues: none found" in out
    for trial in data["trials"]:
        assert trial["error"] is None
        assert trial["graphs"] == 1
        assert trial["segments"], trial                         # the scopes really reached the graph
        assert {s["scope"] for s in trial["segments"]} <= set(trial["scopes"])
        assert trial["unscoped_ops"] < trial["ops"]
    by_name = {t["strategy"]: t for t in data["trials"]}
    assert len(by_name["all_layers"]["segments"]) == 1          # one scope over the back-to-back layers
    assert len(by_name["decoder_layer"]["segments"]) == 4
    # terminal output names the parts found
    assert "decoder layers: 4" in out
    if name != "llama-tiny":
        assert "MoE layers: " in out and ("experts" in out)
    if name == "deepseek-v3-tiny":
        assert "MLA" in out and "shared_experts" in out


def check_profile(data: dict, out: str, strategies: list[str]) -> None:
    """What ``superkernel analyze --profile --json`` adds: the eager step's profile and one forecast per plan."""
    prof = data["profile"]
    assert sum(v["share"] for v in prof["kinds"].values()) == pytest.approx(1.0)
    assert prof["launches_per_step"] > 0 and prof["measured_ms"] > 0
    assert [p["strategy"] for p in data["plans"]] == strategies
    assert "where the eager decode step spends its time" in out and "top modules" in out


# deepseek-v3-tiny: the same checks, and check_profile, run on the analysis docs/workflow.md's example writes
# (tests/workflow/test_wf_docs.py::test_doc_examples_run), which analyzes that model with --profile; llama-tiny's
# eager profile is also part of the e2e optimize run (test_wf_optimize.py).
@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if n != "deepseek-v3-tiny"])
def test_analyze_cli_on_every_zoo_model(name, tmp_path):
    out = tmp_path / "analysis.json"
    result = run_cli("analyze", "--model", name, "--prompt-len", "4", "--json", str(out))
    assert result.code == 0, result.err
    data = json.loads(out.read_text())
    check_zoo_analysis(name, data, result.out)


def test_trial_capture_reports_cuts_with_reasons_and_source(llama_session):
    """An operator that cannot be fused inside a scope is listed with its reason and model source line."""
    from superkernel.pipeline.segments import register_unfusable, unregister_unfusable

    plan = plan_for("attention", analyze_structure(llama_session.model))
    register_unfusable(torch.ops.aten.index_copy_, "test: KV-cache write marked unfusable")
    register_unfusable(torch.ops.aten.index_copy, "test: KV-cache write marked unfusable")
    try:
        result = analyze("llama-tiny", llama_session, [plan])
    finally:
        unregister_unfusable(torch.ops.aten.index_copy_)
        unregister_unfusable(torch.ops.aten.index_copy)
    trial = result.trials[0]
    assert trial.error is None
    assert len(trial.cuts) == 8  # keys and values in each of 4 layers
    assert {c.reason for c in trial.cuts} == {"test: KV-cache write marked unfusable"}
    assert all(c.scope == "attention" and "index_copy" in c.op for c in trial.cuts)
    assert all(c.source and "cache_utils.py" in c.source for c in trial.cuts)
    assert len(trial.segments) > 4  # the cuts split each attention scope
    assert superkernel.scope_apply.scoped_modules(llama_session.model) == {}
    assert result.issues == ["attention: 8 cut(s) (test)"]


def test_analyze_custom_scopes_and_bad_glob(tmp_path):
    ok = run_cli("analyze", "--strategy", "custom", "--scope", "qk=model.layers.*.self_attn.q_proj",
                 "--prompt-len", "4", "--json", str(tmp_path / "a.json"))
    assert ok.code == 0, ok.err
    trial = json.loads((tmp_path / "a.json").read_text())["trials"][0]
    assert trial["wrapped"] == [f"model.layers.{i}.self_attn.q_proj" for i in range(4)]
    bad = run_cli("analyze", "--strategy", "custom", "--scope", "qk=model.layers.*.attn")
    assert bad.code == 2
    assert "matches no submodule" in bad.err and "self_attn" in bad.err  # suggests close module paths


def test_scopes_that_reach_no_graph_are_flagged():
    from types import SimpleNamespace

    from superkernel.tools.advisor.analysis import TrialCapture, missing_labels
    from superkernel.tools.advisor.strategies import ScopePlan

    segments = [SimpleNamespace(scope="attention")]
    assert missing_labels(["attention", "moe"], segments) == ["moe"]
    trial = TrialCapture(plan=ScopePlan("custom", {"attention": ["a"], "moe": ["b"]}), segments=segments)
    assert trial.uncaptured == ["moe"]
    trial.error = "capture failed"
    assert trial.uncaptured == []  # an error is reported as such, not as a missing scope


def test_a_trial_capture_with_reference_is_the_exactness_reference_bit_for_bit(llama_session):
    """optimize keeps the trial's whole decode as the strategy's exactness reference instead of capturing the
    same scopes again: it must be exactly what run_plan's own reference capture gives."""
    from superkernel.tools.advisor.analysis import trial_capture
    from superkernel.tools.advisor.compiling import compile_superkernel
    from superkernel.tools.decode import run_decode

    plan = plan_for("decoder_layer", analyze_structure(llama_session.model))
    trial = trial_capture(llama_session, plan, reference=True)
    assert trial.error is None and trial.reference_logits is not None
    assert trial_capture(llama_session, plan).reference_logits is None  # analyze alone does not decode
    superkernel.apply_scopes(llama_session.model, plan.scopes)
    try:
        step, _ = compile_superkernel(llama_session, "reduce-overhead", run_eagerly=True)
        again = run_decode(llama_session, step).logits
    finally:
        superkernel.remove_scopes(llama_session.model)
        llama_session.restore_cache()
        torch._dynamo.reset()
    assert trial.reference_logits.shape == (llama_session.total_steps, again.shape[-1])
    assert torch.equal(trial.reference_logits, again)


def test_graphs_and_breaks_read_from_the_harness_run_are_explains():
    """analyze reads the step's graphs and breaks from the first step of its recompile run instead of tracing
    the step once more with torch._dynamo.explain: both must agree, on a step with a graph break and symbolic
    sizes (a growing cache tensor) too."""
    from superkernel.tools.advisor.analysis import dynamo_breaks, step_facts
    from superkernel.tools.decode import prepare

    from .test_wf_growing_cache import GrowingHistory

    session = prepare(GrowingHistory(), prompt_len=6, steps=3, warmup=2)
    graphs, breaks = dynamo_breaks(session)
    facts = step_facts(session)
    assert graphs >= 2 and len(breaks) == 1 and "graph_break" in breaks[0].reason, breaks
    assert (facts.graphs, facts.breaks) == (graphs, breaks)
    assert facts.recompiles_with_harness == 0, facts.reasons_with_harness
