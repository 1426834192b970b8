"""Running the kernels under Triton's CPU interpreter (``TRITON_INTERPRET=1``), as the tests and the benchmark's
``--check`` do where there is no GPU.

Triton 3.6's interpreter keeps bfloat16 tensors as their raw 16-bit patterns (``uint16``) and its ``tl.dot`` hands
those integers to ``numpy.matmul`` unconverted (it converts only 8-bit floats): a bfloat16 ``tl.dot`` returns
garbage (errors of 1e10 on unit-sized inputs), while a compiled kernel is right. :func:`fix_bf16_dot` widens
bfloat16 operands to float32 first (exact), leaving the kernels themselves unchanged.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fix_bf16_dot() -> bool:
    """Patch the interpreter's ``create_dot`` once per process (a no-op if already patched or if bfloat16 dots come
    out right); returns whether a patch is in place."""
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
