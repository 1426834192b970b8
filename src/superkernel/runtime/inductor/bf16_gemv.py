"""bf16 / fp16 weights on a CPU without native bf16 arithmetic: Inductor's C++ GEMM micro-kernel loads them whole
and prefetches ahead.

On an AVX2 CPU (no ``avx512_bf16``, no AMX) Inductor's C++ GEMM template runs bf16 GEMMs with its fp32
micro-kernel (``CppMicroGemmFP32Vec``): it loads 8 bf16 weights, widens them to fp32 and accumulates with FMA,
which is all the arithmetic a decode GEMV (M = 1) needs. Two details of that kernel keep a bf16 decode step
far from the memory bound (measured on Qwen2-0.5B's shapes, AMD EPYC, 1 thread, weights read from memory:
benchmarks/results/bf16_gemv.md):

* each load of 8 weights is ``Vectorized<BFloat16>::loadu(p, 8)``, a partial load that ATen's AVX2 code
  makes with a ``memcpy`` into a zeroed 32-byte stack buffer and a reload (a store-forwarding stall per 8
  weights); ``at::vec::load_fp32_from_bf16`` / ``_fp16`` loads the 16 bytes and widens them in registers;
* per byte of weight the kernel issues twice the instructions of its fp32 twin, so the core has fewer bytes
  in flight and reads memory slower than fp32 does; a software prefetch 2 KiB ahead in the packed weight
  (the template's blocks are contiguous, so ahead is the next bytes read) makes up most of it.

Together: 11.1-11.5 -> 15.1-15.3 GB/s for Qwen2-0.5B's MLP projections, 10.6 -> 15.7 for its lm_head (the
fp32 kernel on fp32 weights: 16.5-18.3; 1 KiB, 4 KiB and other prefetch hints measured no better).

:func:`bf16_weight_loads` renders the micro-kernel with both changes (the bf16/fp16 weight branch only:
fp32 weights and the transposed-B and N-tail variants are untouched). The arithmetic is the same (exact
widening, same FMA order), so results are bit-identical to the unpatched kernel's. ``inductor.bf16_gemv``:
``"auto"`` (default) applies it where :func:`native_bf16` is false and Inductor vectorizes with AVX2;
``True`` wherever Inductor's ISA is AVX2; ``False`` never.
"""

from __future__ import annotations

import contextlib
import unittest.mock
from typing import Any, Iterator

#: ``inductor.bf16_gemv`` values
SETTINGS = ("auto", True, False)

#: how far ahead of the weights being read the patched kernel prefetches (bytes)
PREFETCH_BYTES = 2048

_PARTIAL_LOAD = """            auto b = VectorizedIn::loadu(B + k * ldb + col * VLEN, VLEN);
            vb[col] = at::vec::convert<{{compute_t}}>(b);"""
_WHOLE_LOAD = """            if constexpr (col == 0) {
                _mm_prefetch(reinterpret_cast<const char*>(B + k * ldb) + %d, _MM_HINT_T0);
            }
            at::vec::load_fp32_from_{{ "bf16" if input2_dtype == torch.bfloat16 else "fp16" }}(B + k * ldb + col * VLEN, vb[col]);"""


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (``avx512_bf16`` or AMX tiles), as torch's cpuinfo reports it."""
    import torch

    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(cpu, probe, None)
        if check is not None and check():
            return True
    return False


def inductor_isa_is_avx2() -> bool:
    """Whether Inductor generates AVX2 code here (the ISA whose fp32 micro-kernel this patches)."""
    try:
        from torch._inductor.cpu_vec_isa import VecAVX2, pick_vec_isa
    except ImportError:
        return False
    return type(pick_vec_isa()) is VecAVX2


def applies(setting: Any) -> bool:
    """Whether ``inductor.bf16_gemv = setting`` patches the micro-kernel on this machine."""
    if setting not in SETTINGS:
        raise ValueError(f"inductor.bf16_gemv: {setting!r} is not one of {SETTINGS}")
    if setting is False or not inductor_isa_is_avx2():
        return False
    return setting is True or not native_bf16()


def patched_template(template: str) -> str | None:
    """Inductor's micro-kernel template text with the whole-vector loads and the prefetch; None where this
    torch's template does not contain the partial load exactly once (another version: left alone)."""
    if template.count(_PARTIAL_LOAD) != 1:
        return None
    return template.replace(_PARTIAL_LOAD, _WHOLE_LOAD % PREFETCH_BYTES)


@contextlib.contextmanager
def bf16_weight_loads(setting: Any = "auto") -> Iterator[bool]:
    """Inside: Inductor renders its fp32 micro-kernel's bf16/fp16 weight loads whole, with a prefetch ahead
    (see the module doc), where :func:`applies`. Yields whether it does."""
    if not applies(setting):
        yield False
        return
    try:
        import torch._inductor.compile_fx  # noqa: F401 - cpp_micro_gemm imports need Inductor loaded first
        from torch._inductor.codegen.cpp_micro_gemm import CppMicroGemmFP32Vec
    except ImportError:
        yield False
        return
    text = patched_template(getattr(CppMicroGemmFP32Vec, "TEMPLATE_KERNEL", ""))
    if text is None:
        yield False
        return
    with unittest.mock.patch.object(CppMicroGemmFP32Vec, "TEMPLATE_KERNEL", text):
        yield True
