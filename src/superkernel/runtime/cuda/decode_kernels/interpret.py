"""Running the kernels under Triton's CPU interpreter (``TRITON_INTERPRET=1``), as the tests and the benchmark's
``--check`` do where there is no GPU.

Triton 3.6's interpreter keeps bfloat16 tensors as their raw 16-bit patterns (``uint16``) and its ``tl.dot`` hands
those integers to ``numpy.matmul`` unconverted (it converts only 8-bit floats): a bfloat16 ``tl.dot`` returns
garbage (errors of 1e10 on unit-sized inputs), while a compiled kernel is right. And its float32 -> bfloat16 cast
(``x.to(tl.bfloat16)``, every store of a bfloat16 output) truncates toward zero, where the GPU's ``cvt.rn.bf16.f32``
rounds to nearest even: results a full unit in the last place off (2**-7 of the value). :func:`fix_bf16` patches
both in the interpreter (bfloat16 dot operands widened to float32, exactly; the cast rounded to nearest even), leaving
the kernels themselves unchanged.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fix_bf16() -> None:
    """Both patches below, once per process."""
    fix_bf16_dot()
    fix_bf16_cast()


def fix_bf16_cast() -> None:
    """float32 -> bfloat16 casts in the interpreter round to nearest even, as on the GPU (NaN stays NaN)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_superkernel_bf16", False):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f = np.ascontiguousarray(src.data, dtype=np.float32)
            bits = f.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            rounded = np.where(np.isnan(f), np.uint16(0x7FC0), rounded)
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl._superkernel_bf16 = True  # type: ignore[attr-defined]
    builder.cast_impl = cast_impl


def fix_bf16_dot() -> bool:
    """Patch the interpreter's ``create_dot`` once per process (a no-op if already patched); returns whether a
    patch is in place."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_superkernel_bf16", False):
        return True
    original = builder.create_dot

    def widen(handle):
        if handle.dtype.scalar == tl.bfloat16 or handle.dtype == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << np.uint32(16)
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._superkernel_bf16 = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot
    return True
