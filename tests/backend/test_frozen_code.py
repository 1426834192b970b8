"""max-autotune on CPU: identical layers compiled frozen (weights as constants) generate one source,
so Inductor builds their C++ once, while each layer keeps its own (prepacked, template-blocked) weights."""

from __future__ import annotations

import contextlib

import pytest
import torch

import superkernel as sk
import superkernel.runtime.inductor.frozen_code as frozen_code
import superkernel.runtime.inductor.cpu_freezing as inductor_cpu
from superkernel.pipeline.backend import find_backend

from tests.backend.test_shared_kernels import Stack


def _layer_graph() -> torch.fx.GraphModule:
    from torch._inductor.decomposition import select_decomp_table

    def layer(x, w1, b1, w2):
        h = torch.nn.functional.linear(x, w1, b1).relu()
        return (torch.nn.functional.linear(h, w2) + x,)

    shapes = [(1, 32), (64, 32), (64,), (32, 64)]
    return torch.fx.experimental.proxy_tensor.make_fx(layer, decomposition_table=select_decomp_table())(
        *[torch.zeros(s) for s in shapes])


class _Builds:
    """Counts Inductor's C++ builds (g++ runs), calling through to the real builder."""

    def __init__(self, monkeypatch):
        from torch._inductor import cpp_builder

        self.count, real = 0, cpp_builder.CppBuilder.build

        def build(builder):
            self.count += 1
            return real(builder)

        monkeypatch.setattr(cpp_builder.CppBuilder, "build", build)


@pytest.mark.slow
def test_identical_frozen_layers_share_one_build_and_keep_their_own_weights(monkeypatch, tmp_path):
    # an empty Inductor cache: on a warm one (an earlier run) even the first layer loads without g++; and
    # none in memory either (another test in this process may have built the same source: test_bf16_gemv)
    from torch._inductor.utils import clear_caches

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    clear_caches()
    # the C++ GEMM template only: it blocks each weight into a new constant while lowering (the weight
    # a wrong reuse would take from the first layer)
    monkeypatch.setattr(inductor_cpu, "GEMM_BACKENDS", "CPP")
    gm, gen = _layer_graph(), torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, generator=gen)
    layers = [[torch.randn(s, generator=gen) for s in [(64, 32), (64,), (32, 64)]] for _ in range(3)]

    def compile_all(builds=None):
        fns, builds_after_first = [], 0
        for i, weights in enumerate(layers):
            before = builds.count if builds else 0
            with torch.no_grad():
                fns.append(inductor_cpu.compile_frozen(gm, [x, *weights], {1: weights[0], 2: weights[1], 3: weights[2]},
                                                       cpp_wrapper=True, autotune=True, gemm_templates=True))
            if builds and i:
                builds_after_first += builds.count - before
        with torch.no_grad():
            outs = [fn(x, *w)[0] for fn, w in zip(fns, layers)]
        return outs, [fn.source_key for fn in fns], builds_after_first

    from torch._dynamo.utils import counters

    counters.clear()
    builds = _Builds(monkeypatch)
    shared, keys, builds_after_first = compile_all(builds)
    assert counters["inductor"]["cpp_templated_kernel_counter"] >= 3  # the template ran for every layer
    assert keys[0] is not None and keys == [keys[0]] * 3  # one generated source for the three layers
    assert builds_after_first == 0  # layers 2 and 3: no g++ at all
    assert builds.count >= 1

    monkeypatch.setattr(frozen_code, "value_free_constant_comments", contextlib.nullcontext)
    alone, alone_keys, _ = compile_all()
    assert len(set(alone_keys)) == 3  # each layer built on its own
    for a, b, w in zip(shared, alone, layers):
        assert torch.equal(a, b)  # the shared build computes exactly what a layer's own build does
        torch.testing.assert_close(a, gm(x, *w)[0], rtol=1e-4, atol=1e-4)
    assert not torch.equal(shared[0], shared[1]) and not torch.equal(shared[1], shared[2])  # own weights


@pytest.mark.slow
def test_dynamo_layers_with_other_node_names_share_the_frozen_build():
    torch.manual_seed(0)
    model, x = Stack(layers=2).eval(), torch.randn(1, 1, 16)
    cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {"freezing": True, "gemm_templates": False}})
    fn = sk.compile(model, cfg)
    with torch.no_grad():
        out, want = fn(x), model(x)
    counters = find_backend(fn).counters
    assert counters["partitions_frozen"] == 4
    assert counters["partitions_frozen_code_shared"] == 2  # layer 2's attn and mlp: layer 1's source
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def test_shape_arrays_are_keyed_by_the_buffer_written_not_by_a_bound_methods_id():
    """torch 2.11 keyed them by ``id(writeline)``, a bound method made anew per call (the layers of
    test_dynamo_layers_with_other_node_names_share_the_frozen_build then got other sources there:
    ``make test-gpu-versions``); the tweak applies only to a method that keys so."""
    from torch._inductor.utils import IndentedBuffer

    first, second = IndentedBuffer(), IndentedBuffer()
    assert first.writeline is not first.writeline  # a new bound method on every attribute read
    key = frozen_code.int_array_key
    assert key("{1L}", first.writeline, False, None) == key("{1L}", first.writeline, False, None)
    assert key("{1L}", first.writeline, False, None) != key("{1L}", second.writeline, False, None)

    def keyed_as_in_2_11(self, int_array, writeline, known_statically=False, graph=None):
        return (int_array, id(writeline), known_statically, id(graph) if graph else None)

    def keyed_as_in_2_13(self, int_array, writeline, known_statically=False, graph=None):
        return (int_array, id(writeline.__self__) if hasattr(writeline, "__self__") else id(writeline))

    assert frozen_code._keys_int_arrays_by_transient_id(keyed_as_in_2_11)
    assert not frozen_code._keys_int_arrays_by_transient_id(keyed_as_in_2_13)


def test_canonical_graph_renames_by_position_and_keeps_the_original():
    gm = _layer_graph()
    names = [n.name for n in gm.graph.nodes]
    canon = frozen_code.canonical_graph(gm)
    assert [n.name for n in canon.graph.nodes] == [f"n{i}" for i in range(len(names))]
    assert [n.name for n in gm.graph.nodes] == names
    args = [torch.randn(1, 32), torch.randn(64, 32), torch.randn(64), torch.randn(32, 64)]
    assert torch.equal(canon(*args)[0], gm(*args)[0])
