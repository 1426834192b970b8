"""Realization on CPU: reduce-overhead is bit-exact against the exactness reference,
max-autotune compiles each segment with TorchInductor and stays within tolerance,
a segment that fails to compile falls back alone."""

from __future__ import annotations

import warnings

import pytest
import torch

import superkernel as sk
from superkernel.pipeline.realize import SuperKernelFallbackWarning


class Block(torch.nn.Module):
    """A small pre-norm transformer block with scopes in its source."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        with sk.super_kernel("attn"):
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        with sk.super_kernel("mlp"):
            x = x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))
        return x


def compiled(model, mode, run_eagerly=False, **extra):
    cfg = sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}, **extra})
    return sk.compile(model, cfg)


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return Block().eval()


def test_reduce_overhead_is_bit_exact_against_reference(block):
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        ro = compiled(block, "reduce-overhead")
        ref = compiled(block, "reduce-overhead", run_eagerly=True)
        for _ in range(3):  # repeated calls
            assert torch.equal(ro(x), ref(x))
        x2 = torch.randn(3, 5, 32)  # a new shape: a new capture, still exact
        assert torch.equal(ro(x2), ref(x2))
    ex = sk.explain(ro)
    assert {s.realization for s in ex.segments} == {"cpu-native"}
    assert [s.name for s in ex.segments[:2]] == ["attn", "mlp"]
    assert len(ex.graphs) == 2  # one per shape
    assert {s.realization for s in sk.explain(ref).segments} == {"reference"}


@pytest.mark.slow
def test_max_autotune_compiles_each_segment_within_tolerance(block):
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        ma = compiled(block, "max-autotune", inductor={"freezing": False})  # freezing: tests below
        out = ma(x)
        eager = block(x)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    ex = sk.explain(ma)
    assert [(s.name, s.realization, s.fallback) for s in ex.segments] == [
        ("attn", "inductor-cpp", None), ("mlp", "inductor-cpp", None)]
    assert ex.graphs[0].compile_seconds > 0


def test_registered_backend_name_and_explain():
    def f(x):
        with sk.super_kernel("s"):
            return x.sin() * 2

    fn = torch.compile(f, backend="superkernel")
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), f(x))
    assert "s" in sk.explain(fn).scopes
    with pytest.raises(TypeError, match="explain\\(\\) needs a superkernel backend"):
        sk.explain(torch.nn.Linear(2, 2))


# A custom op whose Inductor lowering fails: a real compiler failure confined to one segment.
@torch.library.custom_op("superkernel_test::triple", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@triple.register_fake
def _(x):
    return torch.empty_like(x)


def _install_broken_lowering():
    from torch._inductor.lowering import lowerings, register_lowering

    op = torch.ops.superkernel_test.triple.default
    if op not in lowerings:
        @register_lowering(op)
        def _broken(x):
            raise NotImplementedError("superkernel_test::triple has no Inductor lowering (on purpose)")


def with_broken_segment(x, options=""):
    with sk.super_kernel("good"):
        x = x.sin() + 1
    with sk.super_kernel("bad", options):
        x = torch.ops.superkernel_test.triple(x).cos()
    return x


@pytest.mark.slow
def test_failing_segment_falls_back_alone_with_one_warning():
    _install_broken_lowering()
    fn = compiled(with_broken_segment, "max-autotune")
    x = torch.randn(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(x)
    torch.testing.assert_close(out, with_broken_segment(x))
    ours = [w for w in caught if issubclass(w.category, SuperKernelFallbackWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "segment 'bad' of scope 'bad'" in message and "no Inductor lowering" in message
    segments = {s.name: s for s in sk.explain(fn).segments}
    assert segments["good"].realization == "inductor-cpp" and segments["good"].fallback is None
    assert segments["bad"].realization == "eager" and "no Inductor lowering" in segments["bad"].fallback


@pytest.mark.slow
def test_failing_segment_under_strict_abort_raises():
    _install_broken_lowering()
    fn = compiled(lambda x: with_broken_segment(x, "strict-scope-check=abort"), "max-autotune")
    with pytest.raises(sk.SuperKernelScopeError, match="segment 'bad' of scope 'bad' failed to compile"):
        fn(torch.randn(8))


def test_cuda_realizations_are_wired_without_a_gpu():
    """The CUDA rows of the realization table build their segments' callables (the kernels back to back,
    captured later with the whole step, at the first call), so construction runs anywhere; a wiring error
    would surface as a fallback."""
    from collections import Counter

    from torch._functorch.aot_autograd import aot_module_simplified

    from superkernel.pipeline.partition import split_partitions
    from superkernel.pipeline.realize import Realizer
    from superkernel.runtime.realizations import GraphContext
    from superkernel.ir.graph import SegmentInfo
    from superkernel.pipeline.segments import build_segments

    graphs = []

    def backend(gm, example_inputs):
        def fw(g, _):
            graphs.append(g)
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    def f(x):
        with sk.super_kernel("a"):
            x = x.sin()
        with sk.super_kernel("b", "stream-fusion=1"):
            x = x.cos() + x.exp()
        return x

    torch.compile(f, backend=backend)(torch.randn(2))
    gm = graphs[0]
    modules = split_partitions(gm, build_segments(gm).partitions)
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    counters = Counter()
    realizer = Realizer(GraphContext(cfg, "cuda", counters))  # the CUDA row, on a CPU graph
    with warnings.catch_warnings():
        warnings.simplefilter("error", SuperKernelFallbackWarning)
        infos = [SegmentInfo.of(m.partition) for m in modules if m.partition.kind == "segment"]
        realized = [realizer.realize(m, i) for m, i in zip([m for m in modules if m.partition.kind == "segment"], infos)]
    assert len(realized) == 2 and all(callable(r) for r in realized)
    assert [i.realization for i in infos] == ["cuda-graph", "cuda-graph+2streams"]  # cos | exp, then add
    assert counters["segments_multi_stream"] == 1 and counters["fallbacks"] == 0


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 160), torch.nn.Linear(160, 64)

    def forward(self, x, cache, pos):
        with sk.super_kernel("mlp"):
            h = self.down(torch.relu(self.up(x)))
            cache.index_copy_(0, pos, h)            # an input written in place: never frozen
        return h + 1


@pytest.mark.slow
@pytest.mark.parametrize("freezing", [True, False, "auto"])
def test_max_autotune_cpu_freezes_inference_weights(freezing):
    torch.manual_seed(0)
    model = Mlp().eval()
    # C++ GEMM templates (timed by Inductor per GEMM) only where the weights are frozen for sure
    fn = compiled(model, "max-autotune", inductor={"freezing": freezing, "gemm_templates": freezing is True})
    x, pos = torch.randn(2, 64), torch.tensor([0, 2])
    cache, cache_ref = torch.zeros(4, 64), torch.zeros(4, 64)
    with torch.no_grad():
        out = fn(x, cache, pos)
        ref = model(x, cache_ref, pos)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache, cache_ref, rtol=1e-4, atol=1e-5)
    (seg,) = sk.explain(fn).segments
    expected = {True: {"inductor-cpp+frozen"}, False: {"inductor-cpp"},
                "auto": {"inductor-cpp", "inductor-cpp+frozen"}}[freezing]  # auto: whichever measured faster
    assert seg.realization in expected and seg.fallback is None


@pytest.mark.slow
def test_max_autotune_cpu_does_not_freeze_when_training():
    torch.manual_seed(0)
    model = Mlp()
    fn = compiled(model, "max-autotune", inductor={"freezing": True, "gemm_templates": False})
    x, pos = torch.randn(2, 64), torch.tensor([0, 2])
    out = fn(x, torch.zeros(4, 64), pos)  # grad enabled, weights require grad
    assert out.requires_grad
    (seg,) = sk.explain(fn).segments
    assert seg.realization == "inductor-cpp"


def test_plan_file_records_the_inductor_choice():
    from superkernel.ir.graph import Explanation, GraphInfo, SegmentInfo
    from superkernel.tools.advisor.plan_file import PlanFileError, inductor_choices, read_plan

    def explanation(realization):
        g = GraphInfo(name="graph_0", num_ops=3, mode="max-autotune", device="cpu")
        g.segments.append(SegmentInfo("s", "s", 0, 2, 3, realization))
        return Explanation(graphs=[g])

    assert inductor_choices(explanation("inductor-cpp+frozen")) == {"freezing": True}
    assert inductor_choices(explanation("inductor-cpp")) == {"freezing": False}
    plan = read_plan({"mode": "max-autotune", "scopes": {"s": "layers.*"}, "inductor": {"freezing": True}})
    assert plan.inductor == {"freezing": True} and plan.to_dict()["inductor"] == {"freezing": True}
    assert "inductor" not in read_plan({"mode": "max-autotune", "scopes": {"s": "layers.*"}}).to_dict()
    with pytest.raises(PlanFileError, match="config.inductor.freezing"):
        read_plan({"mode": "max-autotune", "scopes": {"s": "layers.*"}, "inductor": {"freezing": "yes"}})
