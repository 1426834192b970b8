"""max-autotune: identical layers are compiled by Inductor once per graph and the kernel reused."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
import superkernel.runtime.inductor.shared_kernels as shared_kernels
from superkernel.pipeline.backend import find_backend

from tests.backend.test_realize_cpu import Block


class Stack(torch.nn.Module):
    def __init__(self, layers: int = 3, d: int = 16):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(d, heads=2) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def run(model, x):
    torch._dynamo.reset()
    # the Python wrapper: sharing is the same with either wrapper, and a C++ one is another compile per graph
    fn = sk.compile(model, sk.CompilerConfig.from_dict({"mode": "max-autotune",
                                                       "inductor": {"freezing": False, "cpp_wrapper": False}}))
    with torch.no_grad():
        out = fn(x)
    return out, dict(find_backend(fn).counters), sk.explain(fn)


@pytest.mark.slow
def test_identical_layers_compile_once_and_match_the_unshared_path(monkeypatch):
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(1, 1, 16)
    out, counters, ex = run(model, x)
    assert [s.realization for s in ex.segments] == ["inductor-cpu"] * 6  # attn + mlp per layer, none fell back
    assert counters["segments_compiled"] == 6
    assert counters["partitions_reused"] == 4  # layers 2 and 3 reuse layer 1's attn and mlp kernels
    assert counters["partitions_inductor_compiles"] == counters["partitions_compiled"] - 4

    monkeypatch.setattr(shared_kernels, "structural_key", lambda *a: None)  # every partition compiled alone
    alone, counters_alone, _ = run(model, x)
    assert counters_alone.get("partitions_reused", 0) == 0
    assert counters_alone["partitions_inductor_compiles"] == counters_alone["partitions_compiled"]
    assert torch.equal(out, alone)  # the same generated code runs either way
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)


def test_key_ignores_names_and_sees_layouts():
    import torch.fx as fx

    def graph(name: str) -> fx.GraphModule:
        g = fx.Graph()
        a, w = g.placeholder(f"{name}_x"), g.placeholder(f"{name}_w")
        g.output(g.call_function(torch.ops.aten.mm.default, (a, w)))
        return fx.GraphModule({}, g)

    x, w = torch.randn(2, 4), torch.randn(4, 3)
    opts = ("cpu", True, False)
    key = shared_kernels.structural_key(graph("layer0"), [x, w], opts)
    assert key is not None and key == shared_kernels.structural_key(graph("layer7"), [x, w], opts)
    assert key != shared_kernels.structural_key(graph("layer0"), [x, w.t().contiguous().t()], opts)  # strides
    assert key != shared_kernels.structural_key(graph("layer0"), [x.double(), w.double()], opts)  # dtype
    assert key != shared_kernels.structural_key(graph("layer0"), [x, w], ("cpu", False, False))  # codegen options


@pytest.mark.slow
def test_identical_layers_take_the_first_layers_freezing_choice(monkeypatch):
    """plain-vs-frozen is measured once per distinct partition, not once per layer (counted, not timed)."""
    import superkernel.runtime.inductor.cpu_freezing as inductor_cpu

    measured = []
    real_time_variants = inductor_cpu.time_variants
    monkeypatch.setattr(inductor_cpu, "time_variants", lambda *a, **k: measured.append(1) or real_time_variants(*a, **k))
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(1, 1, 16)
    torch._dynamo.reset()
    cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune",
                                       "inductor": {"freezing": "auto", "gemm_templates": False, "cpp_wrapper": False}})
    fn = sk.compile(model, cfg)
    with torch.no_grad():
        out = fn(x)
    counters, segments = find_backend(fn).counters, sk.explain(fn).segments
    assert len(measured) == 2  # layer 1's attn and mlp; layers 2 and 3 are not timed again
    assert counters["partitions_choice_reused"] == 4
    assert [s.realization for s in segments[2:]] == [s.realization for s in segments[:2]] * 2  # same choice per layer
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
