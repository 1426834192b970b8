"""superkernel.yaml: write/read, validation, superkernel.apply, and superkernel bench."""

from __future__ import annotations

import json

import pytest
import torch

import superkernel
from superkernel.util import OutputError, atomic_write
from superkernel.tools.advisor.plan_file import PlanFile, PlanFileError, read_plan, write_plan
from superkernel.tools.decode import run_decode

from .wf_helpers import error_lines, run_cli

ATTN = {"attention": ["model.layers.*.self_attn"]}


def test_round_trip(tmp_path):
    plan = PlanFile(scopes=ATTN, mode="reduce-overhead", options="stream-fusion=1", model="llama-tiny",
                    strategy="attention", measured={"decode_ms_median": 1.5})
    path = write_plan(tmp_path / "superkernel.yaml", plan)
    assert path.read_text().startswith("# superkernel plan")
    again = read_plan(path)
    assert again == plan


@pytest.mark.parametrize("data, message", [
    ({"mode": "reduce-overhead", "scopes": ATTN, "extra": 1}, "unknown key"),
    ({"mode": "fast", "scopes": ATTN}, "mode must be one of"),
    ({"mode": "max-autotune", "scopes": {}}, "non-empty mapping"),
    ({"mode": "max-autotune", "scopes": {"a": 3}}, "module glob or a list"),
    ({"mode": "max-autotune", "scopes": ATTN, "options": "colour=blue"}, "unknown scope option"),
    ({"mode": "max-autotune", "scopes": ATTN, "version": 9}, "version 9 is not supported"),
    ([1, 2], "expected a mapping"),
])
def test_malformed_plans(data, message):
    with pytest.raises(PlanFileError, match=message):
        read_plan(data)


def test_invalid_yaml_file(tmp_path):
    bad = tmp_path / "superkernel.yaml"
    bad.write_text("mode: [\n")
    with pytest.raises(PlanFileError, match="not valid YAML"):
        read_plan(bad)


def test_apply_returns_a_compiled_model_with_the_scopes(llama_session):
    model = llama_session.model
    compiled = superkernel.apply(model, {"mode": "reduce-overhead", "scopes": ATTN})
    try:
        assert superkernel.scope_apply.scoped_modules(model) == {f"model.layers.{i}.self_attn": "attention"
                                                                  for i in range(4)}
        cache = llama_session.cache

        def step(ids, pos):
            return compiled(input_ids=ids, cache_position=pos, use_cache=True, **{llama_session.cache_kwarg: cache}).logits[:, -1, :]

        got = run_decode(llama_session, step)
        ex = superkernel.explain(compiled)
        assert ex.scopes == ["attention"] and len(ex.segments) == 4
        eager = run_decode(llama_session, llama_session.step_fn())
        torch.testing.assert_close(got.logits, eager.logits, rtol=0, atol=1e-5)
    finally:
        superkernel.remove_scopes(model)


# `superkernel bench --config` on a plan file: tests/workflow/test_wf_optimize.py, beside the e2e optimize run
# whose graphs (llama-tiny at E2E_SHAPES) it compiles again.


def test_bench_needs_a_model(tmp_path):
    path = write_plan(tmp_path / "p.yaml", PlanFile(scopes=ATTN, mode="reduce-overhead"))
    result = run_cli("bench", "--config", str(path))
    assert result.code == 2 and "names no model" in error_lines(result.err)[0]


def test_atomic_write_replaces_and_refuses_inputs(tmp_path):
    target = tmp_path / "out.json"
    atomic_write(target, json.dumps({"a": 1}))
    atomic_write(target, json.dumps({"a": 2}))
    assert json.loads(target.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    assert target.stat().st_mode & 0o044  # readable by others like a normal file, not mkstemp's 0600
    with pytest.raises(OutputError, match="refusing to write"):
        atomic_write(target, "x", inputs=[target])
    assert json.loads(target.read_text()) == {"a": 2}


def test_a_torch_compile_plan_round_trips_and_applies(tmp_path):
    import torch

    import superkernel
    from superkernel.tools.advisor.plan_file import PlanFile, PlanFileError, read_plan, write_plan

    path = write_plan(tmp_path / "superkernel.yaml", PlanFile(scopes={}, mode=None, model="llama-tiny",
                                                             backend="torch.compile", measured={"why": "noise"}))
    plan = read_plan(path)
    assert plan.backend == "torch.compile" and plan.scopes == {} and plan.model == "llama-tiny"
    model = torch.nn.Linear(4, 4)
    superkernel.apply_scopes(torch.nn.Sequential(model), {"x": "0"})
    compiled = superkernel.apply(model, path)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    with pytest.raises(PlanFileError, match="has no scopes"):
        read_plan({"backend": "torch.compile", "scopes": {"a": "m"}})
    with pytest.raises(PlanFileError, match="backend must be one of"):
        read_plan({"backend": "inductor", "mode": "reduce-overhead", "scopes": {"a": "m"}})
    with pytest.raises(PlanFileError, match="mode is reduce-overhead or none"):
        read_plan({"backend": "torch.compile", "scopes": {}, "mode": "max-autotune"})


def test_a_reduce_overhead_torch_compile_plan_applies_in_that_mode():
    """What optimize writes when torch.compile(mode="reduce-overhead") was the fastest correct peer (CUDA)."""
    import torch

    import superkernel
    from superkernel.tools.generate import apply_for_generate
    from superkernel.tools.models import load_model

    plan = {"backend": "torch.compile", "scopes": {}, "mode": "reduce-overhead"}
    model = torch.nn.Linear(4, 4)
    compiled = superkernel.apply(model, plan)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    lm = apply_for_generate(load_model("llama-tiny").model, plan)
    config = lm.generation_config.compile_config
    assert (config.backend, config.mode) == ("inductor", "reduce-overhead")
