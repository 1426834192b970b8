"""The CUDA rows' collective rule, run on CPU: a collective is captured in a CUDA graph on NCCL
(>= 2.9.6) and cuts the scope, with the reason, on any other backend. The rule function is
called on real ATen graph nodes; no CUDA run is faked (the CUDA path has not run on hardware)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx

from superkernel.config import MAX_AUTOTUNE, REDUCE_OVERHEAD
from superkernel.ir.graph import ANNOTATION_KEY
from superkernel.pipeline.segments import build_segments
from superkernel.runtime.realizations import REALIZATIONS
from superkernel.runtime.realizations.collectives import collective_cut_reason, collectives, group_name
from superkernel.tools.distributed.launcher import free_port

c10d = torch.ops._c10d_functional


def _graph(group: str, scope: str = "layer") -> fx.GraphModule:
    """x -> mul -> all_reduce -> wait_tensor -> add, every node in ``scope``."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    r = g.call_function(c10d.all_reduce.default, (y, "sum", group))
    w = g.call_function(c10d.wait_tensor.default, (r,))
    z = g.call_function(torch.ops.aten.add.Tensor, (w, x))
    g.output(z)
    for node in g.nodes:
        node.meta["custom"] = {ANNOTATION_KEY: {"scope": scope, "options": ""}}
        node.meta["val"] = torch.empty(4, device="meta")  # a tensor on no real device (not CPU work)
    return fx.GraphModule(torch.nn.Module(), g)


def _nodes(gm: fx.GraphModule) -> dict[str, fx.Node]:
    return {n.target.name() if hasattr(n.target, "name") else n.name: n for n in gm.graph.nodes
            if n.op == "call_function"}


@pytest.fixture(scope="module")
def gloo():
    if dist.is_initialized():
        yield dist.group.WORLD.group_name
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def test_nccl_collectives_are_captured():
    nodes = _nodes(_graph("tp"))
    for op in ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"):
        assert collective_cut_reason(nodes[op], backend_of=lambda g: "nccl", nccl=lambda: (2, 21, 5)) is None
    assert collective_cut_reason(nodes["aten::mul.Tensor"], backend_of=lambda g: "gloo") is None


def test_old_nccl_and_other_backends_cut_with_the_reason():
    nodes = _nodes(_graph("tp"))
    reduce, wait = nodes["_c10d_functional::all_reduce"], nodes["_c10d_functional::wait_tensor"]
    old = collective_cut_reason(reduce, backend_of=lambda g: "nccl", nccl=lambda: (2, 9, 5))
    assert old is not None and "needs NCCL >= 2.9.6" in old and "(2.9.5)" in old
    seen = []
    gloo = collective_cut_reason(wait, backend_of=lambda g: seen.append(g) or "gloo", nccl=lambda: (2, 21, 5))
    assert seen == ["tp"]  # wait_tensor: the group of the collective it waits for
    assert gloo == ("collective that a CUDA graph cannot capture: _c10d_functional::wait_tensor runs on a gloo "
                    "process group ('tp'); only NCCL collectives are captured in a CUDA graph")


def test_the_group_is_read_from_the_node(gloo):
    gm = _graph(gloo)
    nodes = _nodes(gm)
    assert group_name(nodes["_c10d_functional::all_reduce"]) == gloo
    assert group_name(nodes["_c10d_functional::wait_tensor"]) == gloo
    assert collectives(gm) == ["_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"]
    # the default lookup resolves the real process group of this process: gloo
    reason = collective_cut_reason(nodes["_c10d_functional::all_reduce"])
    assert reason is not None and "runs on a gloo process group" in reason


@pytest.mark.parametrize("mode", [REDUCE_OVERHEAD, MAX_AUTOTUNE])
def test_both_cuda_rows_cut_a_gloo_collective_out_of_the_scope(gloo, mode):
    """The rule is the rows' cut rule: segmentation splits the scope at the collective and records why."""
    gm = _graph(gloo)
    seg = build_segments(gm, cut_rule=REALIZATIONS[(mode, "cuda")].cut_reason)
    assert [c.op for c in seg.cuts] == ["_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"]
    assert all("runs on a gloo process group" in c.reason for c in seg.cuts)
    # the CPU rows have no such rule: the collective stays inside the one segment
    cpu = build_segments(_graph(gloo), cut_rule=REALIZATIONS[(mode, "cpu")].cut_reason)
    assert not cpu.cuts
