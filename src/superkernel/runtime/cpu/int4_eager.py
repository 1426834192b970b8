"""The int4 kernel for the calls no plan compiles: ``generate()``'s prompt (prefill) under a max-autotune plan.

A max-autotune plan compiles the decode step only; the prompt runs the model uncompiled, where torchao's CPU int4
linear calls ATen's ``_weight_int4pack_mm_for_cpu`` -- with float32 activations a reference loop, about 25x our
kernel at every row count (1536x576 at group 32, 1 thread: 42.8 ms against 1.7 ms for 20 rows, 210 ms against
8.0 ms for 100), so a SmolLM2-135M int4 plan took 9.87 s for the first token of a 37-token prompt at 1 thread
where the float model's prompt takes 0.33 s (with this mode: 0.73 s; ``benchmarks/results/int4_prompt_smollm2-135m.md``).
:class:`Int4Kernel` (a dispatch mode) sends those calls to ``torch.ops.superkernel.int4_weight_gemv``, the kernel
the plan's compiled step runs, which takes any row count; a call it cannot take stays ATen's. The result differs
from ATen's in the last bits (float32 sums in another order), as the compiled step's does: max-autotune plans
only, a reduce-overhead plan's prompt stays eager's bit for bit. Dequantizing the weight and multiplying with
the float GEMM was tried and is slower below ~250 rows (the dequantization alone took 10 ms a layer in torch
operations).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from superkernel.runtime.quant_schemes import SCHEMES

_ATEN_INT4 = torch.ops.aten._weight_int4pack_mm_for_cpu.default
#: the kernel of the scheme table's int4-weight row (the one its compiled steps run)
KERNEL_OP = SCHEMES["int4-weight"].kernels[0].op


def available() -> bool:
    """Whether this CPU has a vector int4 kernel (the module is built if needed); False where it cannot be built."""
    from superkernel.runtime.cpu import quant_kernels

    return quant_kernels.fast_path(KERNEL_OP)


def takes(x: torch.Tensor, w: torch.Tensor, group: Any, sz: torch.Tensor) -> bool:
    """Whether the kernel takes this ``_weight_int4pack_mm_for_cpu`` call (the checks of the compiled rewrite:
    float32 [M, K] activations, a uint8 [N, K / 2] packed weight with N a multiple of 64, float32 [K / G, N, 2]
    scales and zeros)."""
    if not isinstance(group, int) or x.dtype != torch.float32 or x.dim() != 2 or w.dtype != torch.uint8 \
            or w.dim() != 2 or sz.dtype != torch.float32 or x.device.type != "cpu":
        return False
    n, k = w.shape[0], x.shape[1]
    return n % 64 == 0 and k % group == 0 and w.shape[1] * 2 == k and tuple(sz.shape) == (k // group, n, 2)


class Int4Kernel(TorchDispatchMode):
    """Within this mode a float32 ``_weight_int4pack_mm_for_cpu`` call the kernel takes runs our kernel; ``routed``
    counts them (every other operator runs as it would)."""

    def __init__(self) -> None:
        super().__init__()
        self.routed = 0
        self._kernel = getattr(torch.ops.superkernel, KERNEL_OP).default

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is _ATEN_INT4 and not kwargs and len(args) == 4 and takes(*args):
            self.routed += 1
            return self._kernel(*args)
        return func(*args, **(kwargs or {}))


__all__ = ["Int4Kernel", "KERNEL_OP", "available", "takes"]
