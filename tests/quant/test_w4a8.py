"""The w4a8 scheme, added as one row of the scheme table plus its kernel and rewrite: int4 weights in blocks of 32 x
int8 per-token activations by integer dot products (``torch.ops.superkernel.int4_int8_gemv``)."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.runtime.cpu import quant_kernels

SHAPES = [(1, 64, 128, 32), (3, 48, 256, 64), (2, 17, 96, 32), (8, 5, 512, 256)]


@pytest.fixture(scope="module")
def kernels():
    module = quant_kernels.load()
    if module is None:
        pytest.skip(f"the kernels cannot be built here: {quant_kernels.unavailable_reason()}")
    return module


@pytest.fixture(params=["avx2", "plain"])
def path(request, kernels):
    try:
        kernels.set_isa(1 if request.param == "avx2" else 0)
        if request.param == "avx2" and kernels.fast_path()["int4_int8_gemv"] != "avx2":
            pytest.skip("this CPU has no AVX2")
        yield request.param
    finally:
        kernels.set_isa(2)


def _operands(m, n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=g)
    xs, xz = torch.rand(m, generator=g), torch.randint(-128, 128, (m,), dtype=torch.int8, generator=g)
    ws = torch.rand(n, k // group, generator=g)
    wz = torch.randint(-3, 4, (n, k // group), dtype=torch.int8, generator=g)  # torchao's symmetric int4: zeros
    return x, w, xs, xz, ws, wz


@pytest.mark.parametrize("m, n, k, group", SHAPES)
def test_the_w4a8_gemv_is_the_dequantized_product(path, m, n, k, group):
    """Against float64 on the dequantized operands: exact integer sums per group, float32 across groups."""
    x, w, xs, xz, ws, wz = _operands(m, n, k, group, m * n + k)
    got = torch.ops.superkernel.int4_int8_gemv(x, w, group, xs, xz, ws, wz)
    xd = (x.double() - xz.double()[:, None]) * xs.double()[:, None]
    wd = (w.double() - wz.double().repeat_interleave(group, 1)) * ws.double().repeat_interleave(group, 1)
    ref = xd @ wd.T
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert float((got.double() - ref).abs().max()) <= 1e-6 * float(ref.abs().max()), path


def test_bad_w4a8_operands_are_refused_with_what_is_expected(kernels):
    x, w, xs, xz, ws, wz = _operands(1, 16, 96, 32, 0)
    with pytest.raises(RuntimeError, match="a group size G \\(a multiple of 32 dividing K\\)"):
        torch.ops.superkernel.int4_int8_gemv(x, w, 48, xs, xz, ws, wz)


class Mlp(torch.nn.Module):
    def __init__(self, d=128, h=384, bias=False):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d, h, bias=bias), torch.nn.Linear(d, h, bias=False)
        self.down = torch.nn.Linear(h, d, bias=False)

    def forward(self, x):
        with sk.super_kernel("sp1"):
            return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_max_autotune_runs_w4a8_linears_as_the_integer_kernel(kernels, bias):
    """torchao's dequantize-and-GEMM becomes the kernel (a linear with a bias: the kernel, then the bias added)."""
    pytest.importorskip("torchao")
    from superkernel.tools.quantize import quantize_model

    if not quant_kernels.fast_path("int4_int8_gemv"):
        pytest.skip("no AVX2 here")
    torch.manual_seed(0)
    model = Mlp(bias=bias).eval()
    info = quantize_model(model, "w4a8")
    assert info.layers == 3 and info.group_size == 32 and type(model.gate.weight).__name__ == "IntxUnpackedToInt8Tensor"

    def compiled(mode, run_eagerly=False):
        return sk.compile(model, sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}}))

    ma, ref = compiled("max-autotune"), compiled("max-autotune", run_eagerly=True)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 1, 128)
            torch.testing.assert_close(ma(x), ref(x), rtol=1e-4, atol=1e-5)
    (seg,) = sk.explain(ma).segments
    how = " as superkernel's int4 x int8 kernel"
    assert sorted(seg.rewrites) == sorted([f"W4A8 GEMV (1, 128) x (384, 128)^T (groups of 32){' + bias' * bias}{how}",
                                           f"W4A8 GEMV (1, 128) x (384, 128)^T (groups of 32){how}",
                                           f"W4A8 GEMV (1, 384) x (128, 384)^T (groups of 32){how}"]), seg.rewrites
