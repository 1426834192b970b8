"""superkernel's own int8 GEMV kernels (superkernel.runtime.cpu.quant_kernels), against exact references."""

from __future__ import annotations

import pytest
import torch

from superkernel.runtime.cpu import quant_kernels

SHAPES = [(1, 896, 896), (3, 131, 900), (8, 17, 64), (1, 5, 7), (2, 9, 4864)]  # block + single rows, K tails


@pytest.fixture(scope="module")
def kernels():
    module = quant_kernels.load()
    if module is None:
        pytest.skip(f"the int8 kernels cannot be built here: {quant_kernels.unavailable_reason()}")
    return module


ISA_LEVELS = {"avx512": 2, "avx2": 1, "plain": 0}


@pytest.fixture(params=list(ISA_LEVELS))
def path(request, kernels):
    """Every code path this CPU has: the AVX-512 kernels, the AVX2 ones (an AVX-512 machine runs them when told
    AVX2 is the widest it may use) and the plain loops."""
    level = ISA_LEVELS[request.param]
    try:
        kernels.set_isa(level)
        if request.param != "plain" and kernels.fast_path()["int8_weight_gemv"] != request.param:
            pytest.skip(f"this CPU has no {request.param.upper()}")
        yield request.param
    finally:
        kernels.set_isa(2)


def test_each_op_names_the_kernel_it_runs(kernels):
    """``fast_path`` says which vector kernel each op runs here: the widest this CPU has, and none (falsy) when
    told to keep to the plain loops."""

    capability = torch.backends.cpu.get_cpu_capability()
    try:
        got = kernels.fast_path()
        kernels.set_isa(0)
        plain = kernels.fast_path()
    finally:
        kernels.set_isa(2)
    assert plain == {"int8_gemv": "", "int8_weight_gemv": "", "int4_weight_gemv": "", "int4_int8_gemv": ""}
    if capability == "AVX2":
        assert got == {"int8_gemv": "avx2", "int8_weight_gemv": "avx2", "int4_weight_gemv": "avx2",
                       "int4_int8_gemv": "avx2"}
    elif capability == "AVX512":
        assert got["int8_weight_gemv"] == got["int4_weight_gemv"] == "avx512" and got["int4_int8_gemv"] == "avx2"
        assert got["int8_gemv"] in ("avx512", "avx2")  # AVX-512 without VNNI: the AVX2 dot


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_the_w8a8_dot_is_exact(path, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x[0, :3], w[0, :3] = -128, -128  # the extremes: (-128) * (-128) and the sign flip of -128
    got = torch.ops.superkernel.int8_gemv(x, w)
    assert got.dtype == torch.int32 and torch.equal(got, (x.long() @ w.long().t()).int())


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_the_weight_only_gemv_is_float32_close(path, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    got = torch.ops.superkernel.int8_weight_gemv(x, w)
    want = x.double() @ w.double().t()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_threads_split_the_rows_without_changing_a_value(kernels):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-128, 128, (1, 896), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (1000, 896), dtype=torch.int8, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.superkernel.int8_gemv(x, w), torch.ops.superkernel.int8_weight_gemv(x.float(), w)
        torch.set_num_threads(2)
        two = torch.ops.superkernel.int8_gemv(x, w), torch.ops.superkernel.int8_weight_gemv(x.float(), w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_bad_operands_are_refused_with_what_is_expected(kernels):
    with pytest.raises(RuntimeError, match=r"int8 \[N, K\] CPU tensor expected"):
        torch.ops.superkernel.int8_gemv(torch.zeros(1, 8), torch.zeros(4, 8, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="expected"):
        torch.ops.superkernel.int8_weight_gemv(torch.zeros(1, 8), torch.zeros(4, 9, dtype=torch.int8))


@pytest.mark.parametrize("m, n, k, group", [(1, 128, 256, 64), (3, 64, 128, 32), (8, 192, 384, 128), (2, 64, 64, 64)])
def test_the_int4_gemv_computes_atens_packed_int4_product(path, m, n, k, group):
    """The same packed weight, scales and zeros as torchao's CPU int4 layout: ATen's float32 reference and ours
    agree to float32 rounding (the sums run in another order)."""
    g = torch.Generator().manual_seed(m * n + k + group)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    q[0, :4] = torch.tensor([0, 15, 8, 7])  # the extremes of both nibbles
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.randn(k // group, n, 2, generator=g)
    x = torch.randn(m, k, generator=g)
    got = torch.ops.superkernel.int4_weight_gemv(x, packed, group, scales_and_zeros)
    scale, zero = (scales_and_zeros[torch.arange(k) // group, :, i].t().double() for i in (0, 1))
    want = x.double() @ ((q.double() - 8) * scale + zero).t()
    assert got.dtype == torch.float32 and got.shape == (m, n)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)
    torch.testing.assert_close(got, aten, rtol=1e-5, atol=1e-5 * aten.abs().max().item())


def test_bad_int4_operands_are_refused_with_what_is_expected(kernels):
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.zeros(64, 128, dtype=torch.int32), 1)
    with pytest.raises(RuntimeError, match="float32, a uint8 .N, K / 2. packed int4 weight"):
        torch.ops.superkernel.int4_weight_gemv(torch.zeros(1, 128, dtype=torch.float64), packed, 64,
                                               torch.zeros(2, 64, 2))
    with pytest.raises(RuntimeError, match="N a multiple of 64 and K of the group size 48"):
        torch.ops.superkernel.int4_weight_gemv(torch.zeros(1, 128), packed, 48, torch.zeros(2, 64, 2))


def test_the_int4_layout_is_the_one_aten_packs_for_its_capability(kernels):
    """ATen packs int4 for the vector width it runs with (found on an AVX2 machine: the kernel had read every
    packed weight as AVX512's layout, so its plain loop was wrong wherever ATen is not AVX512)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX512", "AVX2", "DEFAULT"):
        pytest.skip(f"ATen's capability here is {capability}")
    assert quant_kernels.int4_layout() == {"AVX512": 1, "AVX2": 2, "DEFAULT": 3}[capability]
    assert kernels.fast_path()["int4_weight_gemv"] == {"AVX512": "avx512", "AVX2": "avx2", "DEFAULT": ""}[capability]


_LOWERED = """
import torch
from superkernel.runtime.cpu import quant_kernels
assert quant_kernels.load() is not None, quant_kernels.unavailable_reason()
g = torch.Generator().manual_seed(5)
q = torch.randint(0, 16, (128, 256), dtype=torch.int32, generator=g)
packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
sz, x = torch.randn(4, 128, 2, generator=g), torch.randn(2, 256, generator=g)
got = torch.ops.superkernel.int4_weight_gemv(x, packed, 64, sz)
aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, sz)
torch.testing.assert_close(got, aten, rtol=1e-5, atol=1e-5 * aten.abs().max().item())
isa = quant_kernels.load().fast_path()["int4_weight_gemv"]
print(torch.backends.cpu.get_cpu_capability(), quant_kernels.int4_layout(), isa or "plain")
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_int4_gemv_reads_the_layout_of_a_lowered_aten_capability(kernels, capability):
    """``ATEN_CPU_CAPABILITY`` lowers what ATen packs for (an AVX512 machine packing AVX2's layout): the kernel
    follows it, against ATen's own int4 product in that process."""
    import os
    import subprocess
    import sys

    if capability == "avx2" and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("this CPU has no AVX2")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    done = subprocess.run([sys.executable, "-c", _LOWERED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [capability.upper(), *{"default": ["3", "plain"], "avx2": ["2", "avx2"]}[capability]]


_FIRST_LOADED_BY_A_COMPILE = """
import torch
import superkernel as sk
from superkernel.runtime.cpu import quant_kernels
from superkernel.tools.quantize import quantize_model

class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(128, 256, bias=False), torch.nn.Linear(256, 128, bias=False)

    def forward(self, x):
        with sk.super_kernel("sp1"):
            return self.down(torch.relu(self.up(x)))

torch.manual_seed(0)
model = Mlp().eval()
quantize_model(model, "int8-weight")
assert "module" not in quant_kernels._state, "loaded before the compile: this child would test nothing"
ma = sk.compile(model, sk.CompilerConfig.from_dict({"mode": "max-autotune"}))
with torch.no_grad():
    ma(torch.randn(1, 1, 128))
assert quant_kernels.load() is not None, quant_kernels.unavailable_reason()
print(quant_kernels.int4_layout(), quant_kernels.load().fast_path()["int8_weight_gemv"] or "plain")
print("|".join(sk.explain(ma).segments[0].rewrites))
"""


def test_a_process_whose_first_use_is_a_compile_runs_the_kernels(kernels):
    """In real use the module is first needed by a max-autotune compile (the rewrite asks for it inside
    Inductor's fake-tensor mode): a fresh process quantizes, compiles and runs, and the GEMVs are our kernels.
    The int4 layout probe once ran inside that mode, raised, and every such process lost the kernels (a 24-layer
    int8 step 25x slower, found by benchmarks/quant_decode.py; tests that loaded the module themselves first
    did not see it)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_LOADED_BY_A_COMPILE], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    layout_and_path, rewrites = done.stdout.strip().splitlines()[-2:]
    path = kernels.fast_path()["int8_weight_gemv"]
    assert layout_and_path.split() == [str(quant_kernels.int4_layout()), path or "plain"]
    how = "superkernel's int8 kernel" if path else "a reduction reading int8"
    assert len(rewrites.split("|")) == 2 and all(how in r for r in rewrites.split("|")), rewrites
