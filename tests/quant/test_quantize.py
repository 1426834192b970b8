"""Quantized models through superkernel: schemes, both modes, the int8 GEMV rewrite, the seed's example."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

import superkernel as sk
from superkernel.tools.quantize import QuantizationError, SCHEMES, check_scheme, is_quantized, quantize_model

pytest.importorskip("torchao")
ROOT = Path(__file__).resolve().parents[2]


def test_schemes_are_validated_with_what_is_allowed():
    assert set(SCHEMES) == {"int8-weight", "w8a8", "int4-weight", "w4a8"}
    with pytest.raises(QuantizationError, match="unknown quantization 'int3'; allowed: int8-weight, w8a8, int4-weight"):
        check_scheme("int3")
    with pytest.raises(QuantizationError, match="group_size applies to int4-weight and w4a8 only"):
        check_scheme("w8a8", 64)
    with pytest.raises(QuantizationError, match="allowed: 32, 64, 128, 256"):
        check_scheme("int4-weight", 48)
    assert check_scheme("int4-weight") == ("int4-weight", None)  # chosen for the model when quantizing
    assert check_scheme("int4-weight", 64) == ("int4-weight", 64)


class Mlp(torch.nn.Module):
    def __init__(self, d=128, h=384):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d, h, bias=False), torch.nn.Linear(d, h, bias=False)
        self.down = torch.nn.Linear(h, d, bias=False)

    def forward(self, x):
        with sk.super_kernel("sp1"):
            return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_quantize_model_reports_what_it_did_and_refuses_twice(scheme):
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(1, 1, 128)
    with torch.no_grad():
        before = model(x)
    info = quantize_model(model, scheme)
    assert info.layers == 3 and is_quantized(model) and info.library.startswith("torchao")
    assert info.weight_bytes_after < info.weight_bytes_before / (3 if scheme != "int4-weight" else 5)  # (w4a8: int8)
    with torch.no_grad():
        after = model(x)
    rel = float((after - before).norm() / before.norm())
    assert 0 < rel < (0.2 if "4" in scheme else 0.05), rel  # quantization's own error, bounded
    with pytest.raises(QuantizationError, match="quantized already"):
        quantize_model(model, scheme)


def test_a_model_without_quantizable_layers_is_an_error():
    model = torch.nn.Sequential(torch.nn.Linear(100, 8))  # 8 output features: ATen's int4 packing refuses them
    with pytest.raises(QuantizationError, match="no linear layer it can quantize .*not a multiple of 16"):
        quantize_model(model, "int4-weight", group_size=32)


def test_int4_leaves_layers_the_packed_layout_cannot_take_in_float_and_says_why():
    """ATen's CPU int4 packing raises on output features not a multiple of 16 (mamba's x_proj): such a layer
    is skipped before torchao touches the model, instead of an error halfway through quantizing it."""
    model = torch.nn.ModuleList([torch.nn.Linear(64, 40), torch.nn.Linear(64, 64)])  # (only quantized, not run)
    info = quantize_model(model, "int4-weight", group_size=32)
    assert info.layers == 1 and type(model[0].weight) is torch.nn.Parameter
    assert info.skipped == ["0: 40 output features are not a multiple of 16 (the packed CPU int4 layout's)"]


def compiled(fn, mode, run_eagerly=False):
    return sk.compile(fn, sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}}))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_reduce_overhead_is_bit_identical_on_every_scheme(scheme):
    torch.manual_seed(0)
    model = Mlp().eval()
    quantize_model(model, scheme)
    ro, ref = compiled(model, "reduce-overhead"), compiled(model, "reduce-overhead", run_eagerly=True)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 1, 128)
            out = ro(x)
            assert torch.equal(out, ref(x))
            assert torch.equal(out, model(x))  # and the quantized eager module's result
    (seg,) = sk.explain(ro).segments
    assert seg.realization == "cpu-native" and seg.fallback is None


@pytest.mark.parametrize("scheme, explained, kernel", [
    ("int8-weight", "rewrite: int8 weight-only GEMV (1, 128) x (384, 128)^T as ", True),
    ("w8a8", "rewrite: W8A8 GEMV (1, 128) x (384, 128)^T as ", True),
    ("int8-weight", "rewrite: int8 weight-only GEMV (1, 128) x (384, 128)^T as ", False),  # (W8A8's: integers test)
    ("int4-weight", "rewrite: int4 weight-only GEMV (1, 128) x (384, 128)^T (groups of 128) as ", True),
    ("int4-weight", "rewrite: int4 weight-only GEMV (1, 128) x (384, 128)^T ", False)],
    ids=["int8-weight-our-kernel", "w8a8-our-kernel", "int8-weight-reduction", "int4-weight-our-kernel",
         "int4-weight-no-kernel-said"])
def test_max_autotune_reads_quantized_weights_once(scheme, explained, kernel, monkeypatch):
    """int8 weight-only: the float32 GEMV over a dequantized weight; W8A8: _int_mm with its column-sum
    correction; both become superkernel's int8 kernel (where this CPU has its AVX-512 or AVX2 path) or else a
    reduction reading the int8 weight once (float32 accumulation). int4 weight-only: ATen's float32 int4 call
    becomes superkernel's int4 kernel (without a vector path it stays ATen's)."""
    from superkernel.runtime.cpu import quant_kernels

    op = {"w8a8": "int8_gemv", "int8-weight": "int8_weight_gemv", "int4-weight": "int4_weight_gemv"}[scheme]
    if kernel and not quant_kernels.fast_path(op):
        pytest.skip(f"no vector kernel on this CPU ({quant_kernels.unavailable_reason() or 'no AVX2'})")
    if not kernel:
        monkeypatch.setattr(quant_kernels, "fast_path", lambda op: False)
    how = {True: "superkernel's int8 kernel", False: "a reduction reading int8"}[kernel]
    if scheme == "int4-weight":
        how = "superkernel's int4 kernel" if kernel else "left to ATen's float32 _weight_int4pack_mm_for_cpu"
    torch.manual_seed(0)
    model = Mlp().eval()
    quantize_model(model, scheme)
    ma, ref = compiled(model, "max-autotune"), compiled(model, "max-autotune", run_eagerly=True)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 1, 128)
            torch.testing.assert_close(ma(x), ref(x), rtol=1e-4, atol=1e-5)
    (seg,) = sk.explain(ma).segments
    assert len(seg.rewrites) == 3 and all(how in r for r in seg.rewrites), seg.rewrites
    assert explained + how in str(sk.explain(ma))


@pytest.mark.parametrize("kernel", [True, False], ids=["our-kernel", "reduction"])
@pytest.mark.parametrize("shifted", [True, False])
def test_the_w8a8_rewrite_gives_the_same_integers(shifted, kernel, monkeypatch):
    """The rewritten graph run as Python: the int32 product equals _int_mm's, bit for bit (our kernel: exact;
    the reduction: sums below 2^24); torchao's uint8-shifted form with its column sum (torch 2.13) and a plain
    int8 _int_mm (torch 2.11)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from superkernel.runtime.cpu import quant_kernels
    from superkernel.runtime.inductor import quant_gemv

    if kernel and not quant_kernels.fast_path("int8_gemv"):
        pytest.skip(f"no vector int8 kernel on this CPU ({quant_kernels.unavailable_reason() or 'no AVX2'})")
    if not kernel:
        monkeypatch.setattr(quant_kernels, "fast_path", lambda op: False)

    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (2, 4864), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (96, 4864), dtype=torch.int8, generator=g)
    if shifted:
        try:
            torch._int_mm(x.to(torch.uint8), w.t())
        except RuntimeError as exc:
            pytest.skip(f"this torch's CPU _int_mm takes no uint8 (torchao does not shift there): {exc}")

    def f(x, w):  # torchao's CPU W8A8 linear, after decomposition
        p = w.permute(1, 0)
        if not shifted:
            return torch._int_mm(x, p)
        u = (x.to(torch.int32) + 128).to(torch.uint8)
        return torch._int_mm(u, p) - p.sum([0], keepdim=True, dtype=torch.int32) * 128

    gm = make_fx(f, decomposition_table=select_decomp_table(), tracing_mode="fake")(x, w)  # the graph Inductor is given
    want = gm(x, w)
    assert torch.equal(want, torch._int_mm(x, w.t()))
    assert [r.split(" (")[0] for r in quant_gemv.rewrite_quantized_gemv(gm)] == ["W8A8 GEMV"]
    assert "_int_mm" not in gm.code and ("superkernel.int8_gemv" in gm.code) == kernel
    got = gm(x, w)
    assert got.dtype == torch.int32 and torch.equal(got, want)


def test_the_rewrite_leaves_large_left_operands_and_bfloat16_to_inductor():
    from superkernel.runtime.inductor.quant_gemv import MAX_ROWS

    torch.manual_seed(0)
    model = Mlp().eval()
    quantize_model(model, "int8-weight")
    ma = compiled(model, "max-autotune")
    with torch.no_grad():
        ma(torch.randn(MAX_ROWS + 1, 128))  # a prefill-sized GEMM: Inductor's own choice
    assert not sk.explain(ma).segments[0].rewrites


def test_the_seeds_example_is_bit_identical_in_reduce_overhead_and_close_in_max_autotune():
    spec = importlib.util.spec_from_file_location("seed_example", ROOT / "examples" / "quantized_superkernel.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.run("reduce-overhead", m=8, k=256, n=128)
    torch._dynamo.reset()
    assert example.run("max-autotune", m=8, k=256, n=128)
