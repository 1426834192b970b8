"""--quantize through the workflow: optimize measures the quantized model and reports quantization's own cost;
the plan records the quantization; apply_for_generate and bench reproduce it from the plan."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torchao")

from superkernel.tools.advisor.plan_file import PlanFileError, read_plan  # noqa: E402


def test_a_plans_quantization_is_validated():
    base = {"mode": "reduce-overhead", "scopes": {"a": "model.layers.*"}}
    assert read_plan({**base, "quantization": {"scheme": "w8a8"}}).quantization == {"scheme": "w8a8"}
    assert read_plan({**base, "quantization": {"scheme": "int4-weight"}}).quantization == \
        {"scheme": "int4-weight"}  # its group size chosen for the model when quantizing
    assert read_plan({**base, "quantization": {"scheme": "int4-weight", "group_size": 64}}).quantization == \
        {"scheme": "int4-weight", "group_size": 64}
    with pytest.raises(PlanFileError, match="quantization: unknown quantization 'fp4'; allowed: int8-weight"):
        read_plan({**base, "quantization": {"scheme": "fp4"}})
    with pytest.raises(PlanFileError, match="'quantization' must be a mapping with 'scheme'"):
        read_plan({**base, "quantization": "w8a8"})
    with pytest.raises(PlanFileError, match="group_size applies to int4-weight and w4a8 only"):
        read_plan({**base, "quantization": {"scheme": "int8-weight", "group_size": 64}})


def test_bad_quantize_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys):
    from superkernel.tools.cli import main

    out = tmp_path / "out"
    for args, message in [(["--quantize", "int3"], "invalid choice: 'int3'"),
                          (["--group-size", "64"], "--group-size applies to --quantize int4-weight / w4a8"),
                          (["--quantize", "w8a8", "--group-size", "64"], "group_size applies to int4-weight and w4a8 only")]:
        try:
            code = main(["optimize", "--output", str(out), *args])
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory):
    """One optimize run on a W8A8 llama-tiny (the public workflow, in this process; the seed's scheme, and the one
    whose plans are judged against eager's measured rounding floor)."""
    from superkernel.tools.advisor.workflow import OptimizeOptions, optimize

    out = tmp_path_factory.mktemp("quantized")
    outcome = optimize(OptimizeOptions(model="llama-tiny", quantize="w8a8", strategy="all_layers",
                                       modes=("reduce-overhead",), steps=4, warmup=1, quiet=True, output=out))
    assert outcome.has_recommendation, outcome.message
    return out


def test_optimize_reports_the_quantization_and_its_own_cost(quantized_run):
    results = json.loads((quantized_run / "results.json").read_text())
    q = results["settings"]["quantization"]
    assert q["scheme"] == "w8a8" and q["layers"] == 29 and q["weight_bytes_after"] < q["weight_bytes_before"]
    assert 0.0 <= q["cost"]["mean_kl"] and q["cost"]["steps"] == 5 and 0 < q["cost"]["max_abs_logit_diff"] < 1
    report = (quantized_run / "superkernel_optimization_report.md").read_text()
    assert "- Quantized: w8a8 with torchao" in report and "greedy tokens agree on" in report
    plan = read_plan(quantized_run / "superkernel.yaml")
    assert plan.quantization == {"scheme": "w8a8"}


def test_optimize_judges_w8a8_against_eagers_own_rounding_floor(quantized_run):
    """The W8A8 run measured eager's floor (eager with its embeddings one ulp off), reported it, and judged
    max-autotune -- and the torch.compile baseline's check -- at max(5e-2, 2 floors)."""
    from superkernel.tools.advisor.precision import W8A8_TOLERANCE

    results = json.loads((quantized_run / "results.json").read_text())
    floor = results["rounding_floor"]
    assert floor["perturbed"] == "Embedding" and floor["factor"] == 2.0
    assert 0 < floor["relative"] < 1 and floor["max_abs"] > 0  # W8A8 carries a one-ulp input change to the logits
    assert results["tolerance"] == max(W8A8_TOLERANCE, 2.0 * floor["relative"])
    report = (quantized_run / "superkernel_optimization_report.md").read_text()
    assert "- W8A8 rounding floor: eager with its `Embedding` output one ulp off" in report


def test_apply_for_generate_quantizes_a_float_model_as_the_plan_says(quantized_run):
    import superkernel
    from superkernel.tools.models import load_model
    from superkernel.tools.quantize import is_quantized, quantize_model

    plan = quantized_run / "superkernel.yaml"
    reference = load_model("llama-tiny").model
    quantize_model(reference, "w8a8")
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=6, do_sample=False, cache_implementation="static")
    model = load_model("llama-tiny").model
    superkernel.apply_for_generate(model, str(plan))
    assert is_quantized(model)
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(tokens, expected)


def test_bench_generate_runs_every_peer_on_the_quantized_model(quantized_run, monkeypatch, tmp_path):
    """bench --generate with a quantized plan: eager and torch.compile get the model the plan runs (quantized),
    not the float checkpoint (the peers are copies of the model bench_generate is given)."""
    from superkernel.tools import generate_bench
    from superkernel.tools.cli import main
    from superkernel.tools.quantize import is_quantized

    given = []

    class Stop(Exception):
        pass

    def recording(model, plan, **kwargs):
        given.append(is_quantized(model))
        raise Stop

    monkeypatch.setattr(generate_bench, "bench_generate", recording)
    with pytest.raises(Stop):
        main(["bench", "--config", str(quantized_run / "superkernel.yaml"), "--generate", "--new-tokens", "2",
              "--prompt-len", "4", "--rounds", "1", "--quiet"])
    assert given == [True]


def test_static_compile_quantizes_as_the_plan_says(tmp_path):
    """static-compile --config of a quantized plan builds for the quantized model (the scopes and the
    quantization of the plan are applied before the decode step is captured); a plan that recommends plain
    torch.compile (optimize writes one when no superkernel plan beats it) is refused with a reason."""
    from superkernel.tools.models import load_model
    from superkernel.tools.quantize import is_quantized
    from superkernel.tools.static_session import build_config

    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nmodel: llama-tiny\nstrategy: all_layers\nmode: max-autotune\n"
                    "scopes:\n  all_layers: [model.layers.*]\nquantization:\n  scheme: int8-weight\n")
    model = load_model("llama-tiny").model
    cfg, sizes = build_config(model, tmp_path, plan=plan)
    assert is_quantized(model) and sizes == [1] and cfg.mode == "max-autotune"
    assert cfg.experimental_config.static_kernel.enable
    plain = tmp_path / "plain.yaml"
    plain.write_text("version: 1\nbackend: torch.compile\nmodel: llama-tiny\nscopes: {}\n")
    assert read_plan(plain).backend == "torch.compile"
    with pytest.raises(ValueError, match="recommends plain torch.compile"):
        build_config(load_model("llama-tiny").model, tmp_path, plan=plain)
