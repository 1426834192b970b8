"""``superkernel optimize`` end to end on llama-tiny, and the honesty of its precision columns."""

from __future__ import annotations

import re

import pytest
import torch
import yaml
from safetensors.torch import load_file

from superkernel.tools.advisor import measure
from superkernel.tools.advisor.plan_file import PlanFile, read_plan, write_plan

from .wf_helpers import E2E_SHAPES, error_lines, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_optimize_exits_zero_and_writes_every_output(e2e):
    result, out, data = e2e
    assert result.code == 0, result.err
    for name in ("superkernel_optimization_report.md", "decode_latency.png", "superkernel.yaml", "results.json",
                 "logits.safetensors", "decode_profile.png", "superkernel.log"):
        assert (out / name).is_file(), name
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave nothing behind
    assert "recommended:" in result.out and "attention" in result.out


def test_results_cover_baselines_and_both_modes(e2e):
    _, _, data = e2e
    names = [r["name"] for r in data["results"]]
    assert names == ["eager", "torch.compile", "attention / reduce-overhead", "attention / max-autotune"]
    for r in data["results"]:
        assert r["decode_ms_median"] > 0 and r["decode_ms_p90"] >= r["decode_ms_median"]
        assert r["tokens_per_s"] == pytest.approx(1000 / r["decode_ms_median"])
    eager, compiled = data["results"][0]["decode_ms_median"], data["results"][1]["decode_ms_median"]
    for r in data["results"][2:]:
        assert r["status"] == "passed"
        assert r["segments"] == 4 and r["wrapped_modules"] == [f"model.layers.{i}.self_attn" for i in range(4)]
        assert r["uncaptured_scopes"] == []
        assert r["speedup_vs_eager"] == pytest.approx(eager / r["decode_ms_median"])
        assert r["speedup_vs_torch_compile"] == pytest.approx(compiled / r["decode_ms_median"])
        assert r["compile_s"] > 0
    assert data["recommended"] in names[1:] + ["eager"]  # a plan, "use torch.compile" or "keep eager"
    assert data["recommendation"]["kind"] in ("plan", "torch.compile", "eager")
    assert isinstance(data["eager_drift"], float)
    for r in data["results"][1:]:  # Dynamo's own count: every compiled run compiled once
        assert r["recompiles_timed"] == 0 and not r["recompiles_in_steady_state"]
    # reduce-overhead runs as a precompiled step (issue 22); each plan's guard path comes with a measured cost
    assert {r["mode"]: r["guard_path"] for r in data["results"][2:]} == {"reduce-overhead": "precompiled",
                                                                         "max-autotune": "full-guards"}
    assert all(r["guard_cost_us"] and min(r["guard_cost_us"].values()) > 0 for r in data["results"][2:])


def test_precision_columns_recomputed_from_saved_logits(e2e):
    """Every reported diff is what comparing the saved tensors gives."""
    _, out, data = e2e
    logits = load_file(str(out / "logits.safetensors"))
    eager = logits["eager"]
    reference = logits["attention / reference"]
    assert eager.shape == (1 + 3, 2048) and logits["__tokens__"].shape == (4, 1)  # [steps, batch]
    for r in data["results"]:
        mine = logits[r["name"]]
        assert r["vs_eager"]["max_abs"] == pytest.approx((mine.double() - eager.double()).abs().max().item(), abs=0)
        assert r["vs_eager"]["identical"] == torch.equal(mine, eager)
        if r["kind"] != "plan":
            continue
        assert r["vs_reference"]["max_abs"] == pytest.approx((mine.double() - reference.double()).abs().max().item(),
                                                             abs=0)
        assert r["vs_reference"]["identical"] == torch.equal(mine, reference)
        agree = (mine.argmax(-1) == reference.argmax(-1)).double().mean().item()
        assert r["vs_reference"]["top1_agreement"] == agree
    ro = next(r for r in data["results"] if r["mode"] == "reduce-overhead")
    assert ro["vs_reference"]["identical"] and ro["vs_reference"]["max_abs"] == 0.0
    assert torch.equal(logits[ro["name"]], reference)


def test_report_is_complete(e2e):
    _, out, data = e2e
    report = (out / "superkernel_optimization_report.md").read_text()
    for heading in ("## Configuration", "## Step 1: model analysis", "## Results", "## Precision",
                    "## Recommendation", "## Cuts, graph breaks and fallbacks"):
        assert heading in report
    kind = data["recommendation"]["kind"]
    assert "batch 1, dtype float32" in report and "recompiles (timed)" in report
    assert "llama-tiny" in report and "Hardware: CPU:" in report and "torch 2." in report
    assert "transformers " in report
    assert re.search(r"!\[[^\]]*\]\(decode_latency\.png\)", report)
    table_rows = [l for l in report.splitlines() if l.startswith("| ") and "reduce-overhead" in l]
    assert table_rows
    if kind == "plan":
        assert "(recommended)" in report and "## How to apply" in report
        assert "superkernel.apply(model, \"superkernel.yaml\")" in report
        assert "```yaml" in report and "cfg.mode =" in report
    elif kind == "torch.compile":
        assert "(recommended)" in report and "**Use plain `torch.compile`**" in report
        assert "backend: torch.compile" in report
    else:
        assert "**Keep eager**" in report
    assert "0.001 x max(1, max |reference logit|)" in report
    assert f"eager was timed again after all plans, {data['eager_drift']:+.1%}" in report
    cuts = report.split("## Cuts, graph breaks and fallbacks", 1)[1]
    assert "- `attention`: 0 cut(s), 0 graph break(s)" in cuts
    for r in data["results"][2:]:  # one realization line per mode, from that plan's own explain()
        realized = ", ".join(f"{k} x{v}" for k, v in r["realizations"].items())
        assert f"  - {r['mode']}: {r['segments']} segment(s), realized as {realized}; guard path {r['guard_path']}" in cuts


def test_profile_and_predictions_are_in_the_results_and_the_report(e2e):
    _, out, data = e2e
    prof = data["profile"]
    assert sum(v["share"] for v in prof["kinds"].values()) == pytest.approx(1.0)
    assert prof["ops_per_step"] > prof["launches_per_step"] > 0
    search = data["search"]
    assert search["exhaustive"] is True  # a single strategy is measured in full ...
    assert search["policy"] == data["settings"]["search"] == "all"  # ... and meets the baselines in the showdown
    assert [p["plan"] for p in search["plans"]] == ["attention / reduce-overhead", "attention / max-autotune"]
    runs = {r["name"]: r for r in data["results"]}
    # the prediction's base is the whole step compiled without scopes: plain torch.compile's own run; the
    # steps reported are those of the final interleaved showdown (a named strategy meets the baselines there)
    assert search["base_ms"] == runs["torch.compile"]["decode_ms_median_own_run"]
    assert all(r["timing"] == "interleaved" for r in runs.values())
    for p in search["plans"]:
        assert p["status"] == "measured" and p["measured_ms"] == runs[p["plan"]]["decode_ms_median"]
        assert 0 < p["covered_share"] <= 1 and p["segments"] == 4 and p["predicted_ms"] > 0
        assert runs[p["plan"]]["profile"]["launches_per_step"] > 0   # the compiled step, profiled while compiled
    report = (out / "superkernel_optimization_report.md").read_text()
    assert "## Where the decode step spends its time" in report and "](decode_profile.png)" in report
    assert "## Plans: predicted vs measured gain" in report
    assert "| `attention / max-autotune` |" in report
    assert (out / "decode_profile.png").read_bytes().startswith(PNG_MAGIC)


def test_chart_is_a_png_with_a_bar_per_run(e2e):
    _, out, _ = e2e
    data = (out / "decode_latency.png").read_bytes()
    assert data.startswith(PNG_MAGIC)
    import matplotlib.image

    image = matplotlib.image.imread(str(out / "decode_latency.png"))
    assert image.shape[0] > 200 and image.shape[1] > 400


def test_yaml_is_the_recommended_plan(e2e):
    _, out, data = e2e
    kind = data["recommendation"]["kind"]
    if kind == "eager":
        assert not (out / "superkernel.yaml").exists()
        return
    text = (out / "superkernel.yaml").read_text()
    plan = read_plan(out / "superkernel.yaml")
    assert yaml.safe_load(text)["version"] == 1 and plan.model == "llama-tiny"
    if kind == "torch.compile":  # no superkernel plan beat plain torch.compile beyond noise
        assert plan.backend == "torch.compile" and plan.scopes == {}
        return
    best = next(r for r in data["results"] if r["name"] == data["recommended"])
    assert plan.scopes == best["scopes"] == {"attention": ["model.layers.*.self_attn"]}
    assert plan.mode == best["mode"]


def _perturbed_compile(real):
    """Make every non-reference reduce-overhead step add a tiny offset to its logits."""
    def compile_superkernel(session, mode, *, run_eagerly=False, **kwargs):
        step, backend = real(session, mode, run_eagerly=run_eagerly, **kwargs)
        if run_eagerly or mode != "reduce-overhead":
            return step, backend
        return (lambda ids, pos: step(ids, pos) + 1e-6), backend
    return compile_superkernel


def test_bench_remeasures_a_plan(tmp_path):
    """(Here rather than in test_wf_plan_file.py: the same graphs as the e2e run, so the worker that ran it loads
    them from its caches instead of two workers compiling them at once.)"""
    path = write_plan(tmp_path / "superkernel.yaml", PlanFile(scopes={"attention": ["model.layers.*.self_attn"]},
                                                            mode="reduce-overhead", model="llama-tiny"))
    result = run_cli("bench", "--config", str(path), *E2E_SHAPES, "--quiet")
    assert result.code == 0, result.err
    assert "eager" in result.out and "torch.compile" in result.out
    last = result.out.strip().splitlines()[-1]
    assert last.startswith("custom / reduce-overhead:") and "ms/step" in last  # no strategy in the file: custom
    assert "bit-identical" in last and "vs eager" in last


def test_a_plan_that_is_not_bit_exact_fails_and_nothing_is_recommended(monkeypatch, tmp_path):
    monkeypatch.setattr(measure, "compile_superkernel", _perturbed_compile(measure.compile_superkernel))
    result = run_cli("optimize", "--strategy", "attention", "--mode", "reduce-overhead", *E2E_SHAPES,
                     "--output", str(tmp_path), "--quiet")
    assert result.code == 1
    lines = error_lines(result.err)
    assert len(lines) == 1 and "no plan passed precision" in lines[0] and "not bit-identical" in lines[0]
    assert not (tmp_path / "superkernel.yaml").exists()
    report = (tmp_path / "superkernel_optimization_report.md").read_text()
    assert "**FAILED**" in report and "No plan passed precision" in report
    import json

    ro = next(r for r in json.loads((tmp_path / "results.json").read_text())["results"]
              if r.get("mode") == "reduce-overhead")
    assert ro["status"] == "failed" and not ro["vs_reference"]["identical"]
    assert 5e-7 < ro["vs_reference"]["max_abs"] < 2e-6            # the injected 1e-6, after fp32 rounding
    assert f"max abs diff {ro['vs_reference']['max_abs']:.3g}" in report  # the numbers of the failure are shown


def test_a_model_that_cannot_be_captured_exits_nonzero(monkeypatch, tmp_path):
    def broken(session, mode, *, run_eagerly=False, **kwargs):
        raise RuntimeError("simulated capture failure")
    monkeypatch.setattr(measure, "compile_superkernel", broken)
    result = run_cli("optimize", "--strategy", "attention", *E2E_SHAPES, "--output", str(tmp_path), "--quiet")
    assert result.code == 1
    lines = error_lines(result.err)
    assert len(lines) == 1 and "model cannot be captured" in lines[0] and "simulated capture failure" in lines[0]


def test_where_the_run_time_went_is_in_the_results_and_the_report(e2e):
    """Every progress task's wall time (quiet runs too), and what ran outside them, add up to the run's wall."""
    _, out, data = e2e
    rt = data["run_time"]
    names = [p["task"] for p in rt["phases"]]
    assert names[0] == "loading llama-tiny"
    assert "compiling torch.compile" in names and "compiling attention / max-autotune" in names
    # the trial capture of the analysis is the strategy's exactness reference: not captured a second time
    assert not any(n.startswith("compiling") and "exactness reference" in n for n in names)
    assert any(n.startswith("analysing model structure") and "exactness reference" in n for n in names)
    assert all(p["seconds"] >= 0 for p in rt["phases"]) and rt["outside_tasks_s"] >= 0
    assert sum(p["seconds"] for p in rt["phases"]) + rt["outside_tasks_s"] == pytest.approx(rt["wall_s"], rel=1e-6)
    compiled = next(p for p in rt["phases"] if p["task"] == "compiling attention / max-autotune")
    max_autotune = next(r for r in data["results"] if r["name"] == "attention / max-autotune")
    assert compiled["seconds"] >= max_autotune["compile_s"]   # the task holds the compile and the timed run
    report = (out / "superkernel_optimization_report.md").read_text()
    section = report.split("## Where this run's time went", 1)[1]
    assert "| compiling attention / max-autotune |" in section and "| (outside the tasks above) |" in section
