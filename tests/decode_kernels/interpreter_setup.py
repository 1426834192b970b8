"""The preamble of the tests that launch the decode kernel set: Triton importable, else skipped; on a machine without
a GPU, Triton's CPU interpreter (``TRITON_INTERPRET=1``, set before the kernels are imported) with bfloat16 rounded as
the GPU rounds it, else skipped. Call :func:`kernel_device` at a test module's top, before importing the kernels."""

from __future__ import annotations

import os

import pytest
import torch


def kernel_device() -> str:
    """``"cuda"`` or ``"cpu"`` (the interpreter); skips the calling module where the kernels cannot run."""
    pytest.importorskip("triton", reason="Triton is not installed here (torch's CPU build has none): make test-triton")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from superkernel.runtime.cuda.decode_kernels.interpret import fix_bf16, interpreting

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not interpreting():
        pytest.skip("no GPU and TRITON_INTERPRET is not set: the kernels cannot run", allow_module_level=True)
    if interpreting():
        fix_bf16()
    return device
