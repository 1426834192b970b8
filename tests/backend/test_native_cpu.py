"""CPU reduce-overhead as one native call per segment: bit-exact against the exactness
reference on small graphs (in-place input updates, multi-output operators, numbers,
views, constants), cached by content, and falling back to the flat program alone when
the build fails. (The llama-tiny decode check lives in test_hf_llama.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch

import superkernel as sk
from superkernel.pipeline.realize import SuperKernelFallbackWarning
from superkernel.runtime.cpu import native as native_cpu

pytestmark = pytest.mark.skipif(not native_cpu.compiler_available(), reason="no C++ compiler")


def compile_pair(fn, **cfg):
    fast = sk.compile(fn, sk.CompilerConfig.from_dict({"mode": "reduce-overhead", **cfg}))
    ref = sk.compile(fn, sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}}))
    return fast, ref


def step(x, w, cache, pos, h16):
    """A decode-like step: KV cache written in place, multi-output ops, numbers, views, constants."""
    with sk.super_kernel("layer"):
        h = torch.relu(x @ w) * 1.5 + 1e-3                     # numbers for Tensor arguments
        cache.index_copy_(0, pos, h[:, :4])                     # in-place update of an input
        top = torch.max(h, dim=-1)                              # two outputs (getitem)
        a, b = h.split(4, dim=-1)                               # a list output (getitem)
        mask = torch.where(torch.arange(8) < 5, 0.0, float("-inf"))
        s = (a.sum(-1) + b.mean(-1) + top.values).unsqueeze(-1) + mask
        half = (h16 * 0.1 + 1e-3).float()                       # float16 with a wrapped double
    y = s.softmax(-1)                                           # unscoped
    with sk.super_kernel("tail"):
        out = (y.t() @ cache[:2]).view(-1)                      # a view as output
    return out, top.indices, half, y.transpose(0, 1)


def inputs():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, generator=g), torch.randn(8, 8, generator=g)
    cache = torch.zeros(6, 4)
    return x, w, cache, torch.tensor([1, 3]), torch.randn(2, 8, generator=g).half()


def test_native_segments_are_bit_exact_and_update_inputs_in_place():
    fast, ref = compile_pair(step)
    x, w, cache, pos, h16 = inputs()
    cache_ref = cache.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SuperKernelFallbackWarning)
        for _ in range(3):
            got = fast(x, w, cache, pos, h16)
            want = ref(x, w, cache_ref, pos, h16)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                assert torch.equal(a, b)
            assert torch.equal(cache, cache_ref) and cache.abs().sum() > 0
    # grad off: an inference graph dispatches below the autograd layers; same values, and the
    # version of the input written in place still moves (AOTAutograd bumps it)
    with torch.no_grad():
        version = cache._version
        for _ in range(2):
            got = fast(x, w, cache, pos, h16)
            want = ref(x, w, cache_ref, pos, h16)
            for a, b in zip(got, want):
                assert torch.equal(a, b) and a.stride() == b.stride()
        assert torch.equal(cache, cache_ref) and cache._version > version
    ex = sk.explain(fast)
    assert {s.name: s.realization for s in ex.segments} == {"layer": "cpu-native", "tail": "cpu-native"}
    assert sk.explain(ref).segments[0].realization == "reference"


def test_boxed_calls_are_bit_exact_too(monkeypatch):
    """Every operator through OperatorHandle::callBoxed (the path used when a typed call does not compile)."""
    import functools

    from superkernel.runtime.cpu.native import segment  # where the realizer's NativeGroup generates its source

    monkeypatch.setattr(segment, "native_source", functools.partial(native_cpu.native_source, typed=False))
    fast, ref = compile_pair(step)
    x, w, cache, pos, h16 = inputs()
    cache_ref = cache.clone()
    for a, b in zip(fast(x, w, cache, pos, h16), ref(x, w, cache_ref, pos, h16)):
        assert torch.equal(a, b)
    assert torch.equal(cache, cache_ref)
    assert {s.realization for s in sk.explain(fast).segments} == {"cpu-native"}


def test_native_off_runs_the_flat_program():
    fast, ref = compile_pair(step, cpu={"native": False})
    x, w, cache, pos, h16 = inputs()
    for a, b in zip(fast(x, w, cache.clone(), pos, h16), ref(x, w, cache.clone(), pos, h16)):
        assert torch.equal(a, b)
    assert {s.realization for s in sk.explain(fast).segments} == {"cpu-flat"}


def test_source_and_key_are_deterministic_and_content_addressed():
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g)

    def f(x):
        return (x * 2).sin().view(2, 2)

    def g(x):
        return (x * 3).sin().view(2, 2)

    torch.compile(f, backend=backend)(torch.randn(4))
    torch.compile(g, backend=backend)(torch.randn(4))
    a1 = native_cpu.native_source([("seg_a", graphs[0])])
    a2 = native_cpu.native_source([("seg_a", graphs[0])])
    b = native_cpu.native_source([("seg_a", graphs[1])])
    assert a1.source == a2.source and a1.key == a2.key
    assert a1.key != b.key and len(a1.key) == 32
    assert "at::_ops::sin::call(" in a1.source and a1.entries == ("seg_a",)
    assert a1.module_name == f"sk_native_{a1.key}"
    boxed = native_cpu.native_source([("seg_a", graphs[0])], typed=False)
    assert "findSchemaOrThrow(\"aten::sin\", \"\")" in boxed.source and "at::_ops::" not in boxed.source
    assert boxed.key != a1.key
    # a built module is found again by its key (another process would load the same file)
    x = torch.randn(4)
    for src in (a1, boxed):
        module = native_cpu.load(src)
        assert native_cpu.library_path(src).exists()
        (out,) = module.seg_a(x)
        assert torch.equal(out, graphs[0](x)[0])


def test_failed_build_falls_back_to_flat_alone_with_one_warning(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")

    def f(x):
        with sk.super_kernel("s"):
            x = x.cos() * 3.0
        return x + 1

    fast, ref = compile_pair(f)
    x = torch.randn(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fast(x)
    assert torch.equal(got, ref(x))
    ours = [w for w in caught if issubclass(w.category, SuperKernelFallbackWarning)]
    assert len(ours) == 1 and "segment 's' of scope 's'" in str(ours[0].message)
    (seg,) = sk.explain(fast).segments
    assert seg.realization == "cpu-flat" and "NativeBuildError" in seg.fallback


def test_tensor_subclass_inputs_run_the_flat_program():
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g)

    torch.compile(lambda x: (x * 2).sin(), backend=backend)(torch.randn(4))
    flat_calls = []

    def flat(*args):
        flat_calls.append(args)
        return graphs[0](*args)

    group = native_cpu.NativeGroup()
    seg = group.add("s", graphs[0], flat)
    x = torch.randn(4)
    assert torch.equal(seg(x)[0], graphs[0](x)[0]) and not flat_calls
    p = torch.nn.Parameter(torch.randn(4), requires_grad=False)  # Parameter is a plain tensor to C++
    seg(p)
    assert not flat_calls

    class Sub(torch.Tensor):
        pass

    seg(x.as_subclass(Sub))
    assert len(flat_calls) == 1


def test_aten_errors_keep_their_python_type():
    def f(cache, pos, x):
        with sk.super_kernel("s"):
            cache.index_copy_(0, pos, x * 2)
        return cache.sum()

    fast = sk.compile(f, sk.CompilerConfig.from_dict({"mode": "reduce-overhead"}))
    cache, x = torch.zeros(4, 3), torch.ones(1, 3)
    fast(cache, torch.tensor([1]), x)
    with pytest.raises(IndexError, match="out of bounds"):  # as the eager operator raises it
        fast(cache, torch.tensor([9]), x)


def test_integer_arithmetic_on_sizes_runs_natively():
    """Symbolic ints (a growing cache position, dynamic sizes): Python arithmetic on them is emitted too."""
    def f(x, n):
        with sk.super_kernel("s"):
            k = max(n - 3, 0) + 1
            y = x[: (k * 2) // 2] * 2.0
            return y.sum(0, keepdim=True) + (n % 4) + (-n) // 3

    cfg = {"mode": "reduce-overhead"}
    fast = sk.compile(f, sk.CompilerConfig.from_dict(cfg), dynamic=True)
    ref = sk.compile(f, sk.CompilerConfig.from_dict({**cfg, "debug": {"run_eagerly": True}}), dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SuperKernelFallbackWarning)
        for rows, n in ((8, 5), (8, 6), (9, 7)):
            x = torch.randn(rows, 3)
            assert torch.equal(fast(x, n), ref(x, n))
    assert {s.realization for s in sk.explain(fast).segments} == {"cpu-native"}


def test_python_integer_semantics():
    from superkernel.runtime.cpu.native import _INT_OPS  # noqa: F401 - the table the emitter uses

    import operator

    assert (-7) // 2 == -4 and (-7) % 2 == 1  # what sk_floordiv / sk_mod reproduce
    assert operator.floordiv in _INT_OPS and operator.mod in _INT_OPS


@pytest.mark.parametrize("dynamic", [False, True])
def test_large_partitions_are_emitted_in_parts_and_stay_bit_exact(monkeypatch, dynamic):
    """A partition over CHUNK_OPS operators becomes several C++ functions (one huge function took g++
    ten minutes on a 24-layer W8A8 step); values crossing a part pass through sk_env, multi-output
    operators stay with their getitems, in-place input updates and numbers still work."""
    from superkernel.runtime.cpu.native import codegen, segment

    sources = []
    real = codegen.native_source

    def recording(programs, **kw):
        src = real(programs, **kw)
        sources.append(src.source)
        return src

    monkeypatch.setattr(codegen, "CHUNK_OPS", 2)
    monkeypatch.setattr(segment, "native_source", recording)

    def f(x, w, cache, pos, n):
        a, b = step(x, w, cache, pos, x.half())[:2]
        with sk.super_kernel("sizes"):
            k = max(n - 3, 0) + 1
            return a, b, x[: (k * 2) // 2].sum(0) + (n % 4)

    fast = sk.compile(f, sk.CompilerConfig.from_dict({"mode": "reduce-overhead"}), dynamic=dynamic)
    ref = sk.compile(f, sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}}),
                     dynamic=dynamic)
    x, w, cache, pos, _ = inputs()
    cache_ref = cache.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SuperKernelFallbackWarning)
        for n in (5, 6):
            for a, b in zip(fast(x, w, cache, pos, n), ref(x, w, cache_ref, pos, n)):
                assert torch.equal(a, b) and a.stride() == b.stride()
            assert torch.equal(cache, cache_ref)
    assert {s.realization for s in sk.explain(fast).segments} == {"cpu-native"}
    text = "\n".join(sources)
    assert "_part1(sk_in, sk_env.data(), sk_out);" in text and "sk_env[0] = c10::IValue(" in text


def test_identical_segments_share_one_function_and_keep_their_own_inputs():
    """A per-layer plan's segments are the same program on other weights: the module emits it once and every
    entry point calls it (SmolLM2's 30 decoder layers: one C++ function instead of 30); each call runs on its
    own arguments, bit-identical to the graph."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g)

    def layer(x, w):
        return (torch.relu(x @ w) * 1.5 + x).sin()

    def other(x, w):
        return (torch.relu(x @ w) * 2.5 + x).sin()

    torch.compile(layer, backend=backend)(torch.randn(2, 4), torch.randn(4, 4))
    torch.compile(layer, backend=backend, dynamic=False)(torch.randn(2, 4), torch.randn(4, 4))
    torch.compile(other, backend=backend)(torch.randn(2, 4), torch.randn(4, 4))
    src = native_cpu.native_source([("seg_0", graphs[0]), ("seg_1", graphs[1]), ("seg_2", graphs[2])])
    assert src.entries == ("seg_0", "seg_1", "seg_2")
    assert src.source.count("static PyObject* seg_0(") == 1
    assert "static PyObject* seg_1(" not in src.source          # the same program: seg_0's function
    assert "static PyObject* seg_2(" in src.source              # another constant: its own
    assert '{"seg_1", (PyCFunction)(void (*)(void))seg_0,' in src.source
    module = native_cpu.load(src)
    g = torch.Generator().manual_seed(1)
    for entry, gm in (("seg_0", graphs[0]), ("seg_1", graphs[1]), ("seg_2", graphs[2])):
        x, w = torch.randn(2, 4, generator=g), torch.randn(4, 4, generator=g)
        (out,) = getattr(module, entry)(x, w)
        assert torch.equal(out, gm(x, w)[0])
