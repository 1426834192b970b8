"""apply_tensor_parallel's checks and the plans docs/distributed.md shows (a 1-rank gloo group)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from superkernel.tools.distributed import STYLES, TensorParallelError, apply_tensor_parallel, model_plan
from superkernel.tools.distributed.launcher import free_port
from superkernel.tools.distributed.optimize import load_tp_plan

DOC = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.up, self.mlp.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])


def test_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(TensorParallelError, match="needs torch.distributed initialized"):
        apply_tensor_parallel(Net(), {"blocks.*.mlp.up": "colwise"})


def test_bad_plans_are_one_clear_error(group):
    with pytest.raises(TensorParallelError, match="unknown style.*diagonal.*supported: colwise"):
        apply_tensor_parallel(Net(), {"blocks.*.mlp.up": "diagonal"})
    with pytest.raises(TensorParallelError, match="'blocks.\\*.attn' matches no module or parameter of Net"):
        apply_tensor_parallel(Net(), {"blocks.*.attn": "colwise"})
    with pytest.raises(TensorParallelError, match="Net has no tensor-parallel plan"):
        apply_tensor_parallel(Net())


def test_zoo_models_bring_their_transformers_plan():
    from superkernel.tools.models import load_model

    plan = model_plan(load_model("qwen3-moe-tiny").model)
    assert plan["model.layers.*.mlp.experts"] == "moe_tp_experts"
    assert set(plan.values()) <= set(STYLES)


def test_doc_examples(group, tmp_path):
    text = DOC.read_text()
    yaml_block = re.search(r"```yaml\n(.*?)```", text, flags=re.S).group(1)
    (tmp_path / "tp_plan.yaml").write_text(yaml_block)
    assert load_tp_plan(tmp_path / "tp_plan.yaml") == {"blocks.*.mlp.up": "colwise", "blocks.*.mlp.down": "rowwise"}
    code = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    scope = {"model": Net()}
    exec(compile(code, str(DOC), "exec"), scope)
    assert scope["sharded"].world_size == 1   # one rank: the plan is checked, nothing to split


def test_bad_plan_files(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(TensorParallelError, match="must map module/parameter globs to styles"):
        load_tp_plan(bad)
    with pytest.raises(TensorParallelError, match="--tp-plan .*missing"):
        load_tp_plan(tmp_path / "missing.yaml")


def test_the_models_own_plan_skips_rules_naming_nothing(group):
    net = Net()
    net.tp_plan = {"blocks.*.mlp.up": "colwise", "blocks.*.mlp.gate": "colwise"}  # as transformers' model plans
    sharded = apply_tensor_parallel(net)
    assert sharded.unmatched == ["blocks.*.mlp.gate"]
    with pytest.raises(TensorParallelError, match="matches no module"):
        apply_tensor_parallel(Net(), dict(net.tp_plan))  # a given plan is strict
