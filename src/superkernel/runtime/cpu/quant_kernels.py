"""Our GEMV kernels for decode-sized quantized linears on x86 CPUs: ``torch.ops.superkernel.int8_gemv``
(W8A8: int8 activation x int8 weight, the exact int32 dot), ``torch.ops.superkernel.int8_weight_gemv``
(float32 activation x int8 weight, float32 accumulation) and ``torch.ops.superkernel.int4_weight_gemv``
(float32 activation x torchao's packed CPU int4 weight with per-group scale and zero).

int4: ATen's ``_weight_int4pack_mm_for_cpu`` with float32 activations is a reference loop (7.4 ms for a
4864x896 GEMV here, 230 ms for Qwen2-0.5B's 151936x896 head) and Inductor's int4 template takes bfloat16
activations only. Ours reads the same packed layout once, per group sums ``x * (q - 8)`` and ``x`` in float32
and adds ``scale * a + zero * sum(x)``: 0.18 ms and 5.4 ms for those two, faster than ATen with bfloat16
activations (0.23 ms, 7.1 ms; ``benchmarks/results/quant_gemv_int4.md``).

Why a kernel of ours: Inductor has no template for an int8 GEMV on the CPU. Its C++ backend compiles the
reduction :mod:`superkernel.runtime.inductor.quant_gemv` writes as a loop that widens every int8 weight to
float32 and multiplies it: compute-bound here at 13-14 GB/s of weights, against 20.6 GB/s for llama.cpp's
Q8_0 (measured, ``benchmarks/results/quant_decode_t1.md``). These kernels read each weight row once with
AVX-512: the W8A8 one multiplies bytes with VNNI's ``vpdpbusd`` (the weight's sign bit flipped to make it the
unsigned operand, ``128 * sum(x)`` subtracted after: exact integers, the very values of ``torch._int_mm``) one
row at a time, so the weight is read as one sequential stream, and prefetches the row four rows on into L2;
the weight-only one widens 16 weights at a time and uses FMA, eight rows at once, the eight rows after the next
eight prefetched (without a prefetch a row block waits on memory: 8-12 GB/s, measured with
``benchmarks/quant_gemv.py``'s shapes); in a Qwen2-0.5B step they read 20-24 GB/s
(``benchmarks/results/quant_decode_t1.md``). Threads split the rows (``at::parallel_for``, torch's thread
count).

Without AVX-512 (AMD before Zen 4, Intel's client CPUs) each op has an AVX2 kernel: W8A8 widens the weight to
int16 and multiplies it by the int16-widened activation with ``vpmaddwd`` (exact: AVX2's byte dot
``vpmaddubsw`` saturates its 16-bit pair sums, so llama.cpp's sign trick is exact only for weights above
-128), four rows a block; weight-only widens 8 weights to float32 a time with FMA, eight rows a block; int4
reads ATen's AVX2 packed layout (32-row blocks) with two sets of sums, one FMA latency apart, and applies each
group's 32 scales and zeros with vector FMAs (a scalar loop had doubled the time of a SmolLM2 GEMV at group 32:
235 -> 115 us for 1536x576, same bits; the AVX-512 kernel keeps its loop, untimed on these AVX2 machines). On an EPYC of
family 25 (Zen 3, 1 thread), a 4864x896 GEMV: W8A8 0.31 ms, weight-only 0.45 ms (Inductor's reduction 6.2 ms),
int4 0.25 ms (ATen's float32 loop 8.7 ms), a plain sum over the int8 bytes 0.26 ms
(``benchmarks/results/quant_gemv_avx2.md``, ``quant_gemv_int4_avx2.md``). A CPU with neither runs a plain loop that computes
the same values, slowly, so a kernel built elsewhere still runs: :func:`fast_path` tells the rewrite whether
to use them at all (and which kernel each op runs: ``"avx512"``, ``"avx2"``, or ``""``).

The module is built from this source by this user (the native build cache: private, signed, keyed by the
source, torch and compiler) and loaded once per process. No compiler, or a failed build: :func:`load`
returns None with the reason, and the rewrite keeps Inductor's reduction. A static-kernel package built
with them carries the module (an operator library: a loading process loads it before any partition).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Iterator

import torch

from superkernel.runtime.cpu.quant_kernels_source import SOURCE as _SOURCE
from superkernel.runtime.cpu.quant_kernels_w4a8_source import SCHEMA as _W4A8_SCHEMA, SOURCE as _W4A8_SOURCE

#: rows of a weight-only block (each block's accumulators stay in registers), prefetched two blocks ahead
ROWS = 8
#: the W8A8 kernel reads one row at a time (one sequential stream through the weight) and prefetches the row
#: ``W8A8_AHEAD`` rows on. ``benchmarks/quant_gemv.py``, 1 thread, Zen 4, against eight-row blocks prefetched
#: two blocks ahead: the 151936x896 lm_head 4.92 ms against 7.23 ms (a plain sum over its bytes: 4.04 ms), the
#: layers' shapes equal within the runs' noise (the weight-only kernel measured slower that way and keeps 8)
W8A8_ROWS, W8A8_AHEAD = 1, 4
W8A8_AVX2_ROWS, W8A8_AVX2_AHEAD = 4, 8
#: ``at::parallel_for`` is OpenMP inside the header: without ``-fopenmp`` it runs on one thread (measured: the
#: 2-thread step as slow as the 1-thread one). The module then needs ``libgomp.so.1``, the OpenMP runtime
#: torch has already loaded (the one Inductor's own C++ kernels use).
FLAGS = ("-fopenmp",)

_lock = threading.Lock()
_state: dict[str, Any] = {}
#: while a static-kernel build or load is compiling: ``provider(source)`` gives the loaded module from the
#: package, or builds it and adds it to the package being built (the native modules' seam)
_PROVIDER: contextvars.ContextVar[Callable[[Any], Any] | None] = contextvars.ContextVar("sk_int8_provider",
                                                                                      default=None)


def source() -> str:
    return _SOURCE % {"rows": ROWS, "w8a8_rows": W8A8_ROWS, "w8a8_ahead": W8A8_AHEAD, "w8a8_avx2_rows": W8A8_AVX2_ROWS,
                      "w8a8_avx2_ahead": W8A8_AVX2_AHEAD, "flags": " ".join(FLAGS), "w4a8": _W4A8_SOURCE,
                      "w4a8_schema": _W4A8_SCHEMA}


@functools.lru_cache(maxsize=1)
def native_source() -> Any:
    """The module as a :class:`~superkernel.runtime.cpu.native.build.NativeSource` (an operator library)."""
    from superkernel.runtime.cpu.native.build import NativeSource, native_key

    text = source()
    return NativeSource(text, native_key(text, FLAGS), (), FLAGS, registers_ops=True)


@contextlib.contextmanager
def provided_by(provider: Callable[[Any], Any] | None) -> Iterator[None]:
    """Within this block :func:`load` takes the module from ``provider`` (a static-kernel workspace)."""
    token = _PROVIDER.set(provider)
    try:
        yield
    finally:
        _PROVIDER.reset(token)


#: the packed int4 layouts the kernel reads (its ``Int4Layout``): code -> (rows a block, the rows of its bytes' low
#: nibbles, of their high nibbles; byte j of a block and k holds the j-th of each)
INT4_LAYOUTS = {1: (64, range(32), range(32, 64)),         # ATen built for AVX512
                2: (32, range(16), range(16, 32)),         # AVX2
                3: (32, range(0, 32, 2), range(1, 32, 2))}  # DEFAULT (no vectors)


def _packed(q: torch.Tensor, code: int) -> torch.Tensor:
    """``q`` ([N, K] values 0..15) packed in layout ``code``: uint8 [N, K / 2], as ATen's packing lays it out."""
    block, low, high = INT4_LAYOUTS[code]
    n, k = q.shape
    blocks = q.reshape(n // block, block, k).transpose(1, 2)  # [N / B, K, B]
    return (blocks[:, :, list(low)] | (blocks[:, :, list(high)] << 4)).to(torch.uint8).reshape(n, k // 2)


@functools.lru_cache(maxsize=1)
def int4_layout() -> int:
    """Which layout ATen's ``_convert_weight_to_int4pack_for_cpu`` packs in this process (it follows ATen's CPU
    capability, which ``ATEN_CPU_CAPABILITY`` can lower): a code of :data:`INT4_LAYOUTS`, found by packing a probe,
    or 0 when it is none of them (the kernel then refuses, and the rewrite keeps ATen's call).

    The module is loaded where a compile first needs it, inside Inductor's fake-tensor mode: the probe runs on
    real tensors outside it (under it ``torch.equal`` raised, and the whole module was lost for the process)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        q = torch.randint(0, 16, (128, 8), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        try:
            got = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        except (RuntimeError, AttributeError):
            return 0
        if got.dtype != torch.uint8 or got.numel() != 128 * 4:
            return 0
        return next((code for code in INT4_LAYOUTS if torch.equal(got.reshape(128, 4), _packed(q, code))), 0)


def _configure(module: Any) -> None:
    module.set_int4_layout(int4_layout())


def _register_fakes() -> None:
    """Shapes for tracing (Inductor's fake tensors): every kernel of the scheme table gives ``[M, N]`` in its row's
    result dtype (``x``, ``w`` first; int4's group and scales after)."""
    from superkernel.runtime.quant_schemes import kernels

    def fake(dtype: torch.dtype) -> Callable[..., torch.Tensor]:
        def shape(x: torch.Tensor, w: torch.Tensor, *_: Any) -> torch.Tensor:
            return x.new_empty((x.shape[0], w.shape[0]), dtype=dtype)
        return shape

    for k in kernels():
        torch.library.register_fake(f"superkernel::{k.op}", fake(getattr(torch, k.out_dtype)))


def adopt(module: Any) -> None:
    """``module`` (this source, loaded from a package) is the one whose operators are registered."""
    with _lock:
        if _state.get("module") is None:
            _register_fakes()
            _configure(module)
            _state["module"], _state["error"] = module, None


def load() -> Any | None:
    """The built module (its ops registered in ``torch.ops.superkernel``), once per process; None when it
    cannot be built here (:func:`unavailable_reason` says why). Inside :func:`provided_by` the provider is
    asked every time (it adds the module to the package being built once)."""
    from superkernel.runtime.cpu.native.build import build_library, load_library
    from superkernel.runtime.cpu.native.literals import NativeBuildError

    provider = _PROVIDER.get()
    with _lock:
        if "module" in _state and (provider is None or _state["module"] is None):
            return _state["module"]
        src = native_source()
        try:
            module = provider(src) if provider is not None else load_library(build_library(src), src.module_name)
            if _state.get("module") is None:
                _register_fakes()
            _configure(module)
        except (NativeBuildError, OSError, ImportError, RuntimeError) as exc:
            _state["module"], _state["error"] = None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return None
        _state["module"], _state["error"] = module, None
        return module


def unavailable_reason() -> str | None:
    return _state.get("error")


def fast_path(op: str) -> bool:
    """Whether ``op`` (a kernel of the scheme table: ``"int8_gemv"``, ``"int8_weight_gemv"``, ``"int4_weight_gemv"``,
    ``"int4_int8_gemv"``) has a vector kernel (AVX-512 or AVX2) on this CPU (the module is built if needed); False
    where it cannot be built."""
    module = load()
    return bool(module is not None and module.fast_path().get(op))


__all__ = ["FLAGS", "INT4_LAYOUTS", "ROWS", "adopt", "fast_path", "int4_layout", "load", "native_source",
           "provided_by", "source", "unavailable_reason"]
