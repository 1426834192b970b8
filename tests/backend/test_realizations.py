"""The realization table: a row registered from outside the package is used end to end."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.runtime.realizations import (
    REALIZATIONS, CpuNative, InductorCpu, Realization, realization_for, register, unregister,
)


class Counting(Realization):
    """A toy realization for the fake device kind "meta": each segment runs its flat program,
    counted; ``aten.relu`` may not run inside a segment (an extra cut rule)."""

    calls: list[str] = []

    @classmethod
    def cut_reason(cls, node):
        return "toy rule: relu runs alone" if "relu" in str(node.target) else None

    def segment(self, job):
        flat, name = job.flat(), job.module.partition.name
        if job.info is not None:
            job.info.realization = "toy-counted"

        def run(*args):
            Counting.calls.append(name)
            return flat(*args)

        return run


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        with sk.super_kernel("mlp"):
            return x + self.down(torch.relu(self.up(x)))


@pytest.fixture
def toy_row():
    register("reduce-overhead", "meta", Counting)
    Counting.calls.clear()
    yield Counting
    unregister("reduce-overhead", "meta")


def test_a_row_registered_from_outside_realizes_a_scoped_model(toy_row):
    model = Mlp().to("meta").eval()
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    fn = sk.compile(model, cfg)
    with torch.no_grad():
        out = fn(torch.empty(2, 8, device="meta"))
        fn(torch.empty(2, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 8)
    ex = sk.explain(fn)
    (graph,) = ex.graphs
    assert graph.device == "meta"
    assert [c.reason for c in ex.cuts] == ["toy rule: relu runs alone"]  # the row's cut rule
    segments = ex.segments
    assert len(segments) == 2 and {s.realization for s in segments} == {"toy-counted"}
    assert toy_row.calls == [s.name for s in segments] * 2  # both segments, both calls, through the row


def test_unregister_restores_the_table():
    before = dict(REALIZATIONS)
    register("max-autotune", "cpu", Counting)
    cfg = sk.CompilerConfig()
    assert realization_for(cfg, "cpu") is Counting
    unregister("max-autotune", "cpu")
    assert REALIZATIONS == before and realization_for(cfg, "cpu") is InductorCpu


def test_a_device_without_a_row_uses_the_modes_cpu_row():
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    assert realization_for(cfg, "xpu") is CpuNative


@pytest.mark.parametrize("args, message", [
    (("fast", "cpu", Counting), "unknown mode 'fast'; allowed: reduce-overhead, max-autotune"),
    (("max-autotune", "", Counting), "device must be a torch device type"),
    (("max-autotune", "xpu", object), "realization must be a subclass of"),
])
def test_register_refuses_bad_rows(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        register(*args)
    assert ("max-autotune", "xpu") not in REALIZATIONS


@pytest.mark.parametrize("device, autotune", [("cuda", False), ("cuda", True), ("cpu", False)])
def test_cuda_max_autotune_traces_a_gemv_as_torch_compile_max_autotune_does(device, autotune):
    """The CUDA max-autotune row traces with coordinate descent tuning on, so Inductor's own mm decomposition
    turns a one-row product into a multiply-and-sum (what ``torch.compile(mode="max-autotune")`` fuses into
    its neighbours); the CPU row traces without it and the product stays ``mm``. Traced on the meta device
    (any device but the CPU takes the decomposition), no GPU involved."""
    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    cfg = sk.CompilerConfig()
    cfg.mode = "max-autotune"
    cfg.inductor.autotune = autotune
    row = realization_for(cfg, device)
    x, w = torch.randn(1, 64, device="meta"), torch.randn(64, 32, device="meta")
    with row.tracing(cfg):
        gm = make_fx(lambda a, b: a @ b, decomposition_table=select_decomp_table())(x, w)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    as_reduction = device == "cuda"
    assert (torch.ops.aten.mm.default in ops) is not as_reduction
    assert (torch.ops.aten.sum.dim_IntList in ops) is as_reduction
    assert not inductor_config.coordinate_descent_tuning  # set only while tracing


def test_cuda_partitions_compile_with_coordinate_descent_tuning():
    from superkernel.runtime.inductor.compile import inductor_patches

    assert inductor_patches("cuda")["coordinate_descent_tuning"] is True
    assert "coordinate_descent_tuning" not in inductor_patches("cpu")
