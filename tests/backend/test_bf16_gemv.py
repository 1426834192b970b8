"""inductor.bf16_gemv: Inductor's fp32 micro-kernel loads bf16 weights whole and prefetches ahead, on CPUs without
native bf16 only (or as configured); the results are the same bits as the kernel as shipped."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
import superkernel.runtime.inductor.cpu_freezing as inductor_cpu
from superkernel.runtime.inductor import bf16_gemv


def _fp32_micro_kernel():
    import torch._inductor.compile_fx  # noqa: F401 - cpp_micro_gemm needs Inductor loaded first
    from torch._inductor.codegen.cpp_micro_gemm import CppMicroGemmFP32Vec

    return CppMicroGemmFP32Vec


def test_the_setting_is_validated_and_honoured(monkeypatch):
    with pytest.raises(ValueError, match="auto"):
        bf16_gemv.applies("yes")
    with pytest.raises(Exception, match="bf16_gemv"):
        sk.CompilerConfig.from_dict({"inductor": {"bf16_gemv": "yes"}})
    assert sk.CompilerConfig().inductor.bf16_gemv == "auto"
    monkeypatch.setattr(bf16_gemv, "inductor_isa_is_avx2", lambda: True)
    monkeypatch.setattr(bf16_gemv, "native_bf16", lambda: False)
    assert bf16_gemv.applies("auto") and bf16_gemv.applies(True) and not bf16_gemv.applies(False)
    monkeypatch.setattr(bf16_gemv, "native_bf16", lambda: True)  # avx512_bf16 / AMX: Inductor's own kernels
    assert not bf16_gemv.applies("auto") and bf16_gemv.applies(True)
    monkeypatch.setattr(bf16_gemv, "inductor_isa_is_avx2", lambda: False)  # another ISA: another micro-kernel
    assert not bf16_gemv.applies(True)


def test_native_bf16_reads_torchs_cpuinfo(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not bf16_gemv.native_bf16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert bf16_gemv.native_bf16()


def test_the_template_is_patched_in_its_bf16_branch_only_and_only_inside(monkeypatch):
    kernel = _fp32_micro_kernel()
    shipped = kernel.TEMPLATE_KERNEL
    patched = bf16_gemv.patched_template(shipped)
    assert patched is not None, "this torch's fp32 micro-kernel no longer has the partial bf16 load"
    assert patched.count("load_fp32_from_") == 1
    assert patched.count("_mm_prefetch") == shipped.count("_mm_prefetch") + 1  # (the int8 branch has its own)
    assert "VectorizedIn::loadu(B + k * ldb + col * VLEN, VLEN)" not in patched
    assert patched.count("Vectorized::loadu(B + k * ldb + col * VLEN)") == shipped.count(
        "Vectorized::loadu(B + k * ldb + col * VLEN)")  # the fp32 weight load is untouched
    assert bf16_gemv.patched_template("no such load") is None
    monkeypatch.setattr(bf16_gemv, "applies", lambda setting: setting is not False)
    with bf16_gemv.bf16_weight_loads(True) as on:
        assert on and kernel.TEMPLATE_KERNEL == patched
    assert kernel.TEMPLATE_KERNEL == shipped
    with bf16_gemv.bf16_weight_loads(False) as on:
        assert not on and kernel.TEMPLATE_KERNEL == shipped


def _bf16_layer():
    from torch._inductor.decomposition import select_decomp_table

    def layer(x, w1, w2):
        h = torch.nn.functional.linear(x, w1).relu()
        return (torch.nn.functional.linear(h, w2) + x,)

    shapes = [(1, 32), (64, 32), (32, 64)]
    return torch.fx.experimental.proxy_tensor.make_fx(layer, decomposition_table=select_decomp_table())(
        *[torch.zeros(s, dtype=torch.bfloat16) for s in shapes])


@pytest.mark.slow
@pytest.mark.skipif(not bf16_gemv.inductor_isa_is_avx2(), reason="the patched micro-kernel is Inductor's AVX2 one")
def test_a_frozen_bf16_compile_uses_the_whole_loads_and_gives_the_same_bits(monkeypatch, tmp_path):
    from torch._inductor import cpp_builder

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_cpu, "GEMM_BACKENDS", "CPP")  # the C++ template, whatever the timings
    sources: list[str] = []
    build = cpp_builder.CppBuilder.build

    def recording_build(self):
        sources.append("".join(open(a).read() for a in self.get_command_line().split() if a.endswith(".cpp")))
        return build(self)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", recording_build)
    gm, gen = _bf16_layer(), torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, generator=gen).to(torch.bfloat16)
    weights = [(torch.randn(s, generator=gen) * 0.1).to(torch.bfloat16) for s in [(64, 32), (32, 64)]]
    outputs = {}
    with torch.no_grad():
        for setting in (False, True):
            sources.clear()
            fn = inductor_cpu.compile_frozen(gm, [x, *weights], {1: weights[0], 2: weights[1]}, cpp_wrapper=True,
                                             autotune=True, gemm_templates=True, gemm_timing="cache",
                                             bf16_gemv=setting)
            outputs[setting] = fn(x, *weights)[0]
            gemm_sources = [s for s in sources if "CppMicroGemm" in s or "micro_gemm" in s]
            assert gemm_sources, "no C++ GEMM template was built"
            assert any("load_fp32_from_bf16" in s for s in gemm_sources) == setting
    assert torch.equal(outputs[True], outputs[False])  # the same arithmetic: the same bits
    reference = gm(x.float(), *[w.float() for w in weights])[0]
    torch.testing.assert_close(outputs[True].float(), reference, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.skipif(not bf16_gemv.inductor_isa_is_avx2(), reason="the patched micro-kernel is Inductor's AVX2 one")
def test_float32_weights_generate_the_same_source_either_way(monkeypatch, tmp_path):
    from tests.backend.test_frozen_code import _layer_graph

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_cpu, "GEMM_BACKENDS", "CPP")
    gm, gen = _layer_graph(), torch.Generator().manual_seed(1)
    x = torch.randn(1, 32, generator=gen)
    weights = [torch.randn(s, generator=gen) for s in [(64, 32), (64,), (32, 64)]]
    keys = set()
    with torch.no_grad():
        for setting in (False, True):
            fn = inductor_cpu.compile_frozen(gm, [x, *weights], {1: weights[0], 2: weights[1], 3: weights[2]},
                                             cpp_wrapper=True, autotune=True, gemm_templates=True,
                                             gemm_timing="cache", bf16_gemv=setting)
            keys.add(fn.source_key)
    assert len(keys) == 1 and None not in keys  # float32 kernels are untouched by the setting
