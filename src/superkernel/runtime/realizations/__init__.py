"""How a partition becomes a callable: one table from (mode, device kind) to a :class:`Realization`.

=====================  ===================  ==========================================================
mode                   device kind          realization
=====================  ===================  ==========================================================
``reduce-overhead``    ``cpu``              :class:`CpuNative`: one native call per segment
``reduce-overhead``    ``cuda``             :class:`CudaGraphReplay`: one CUDA graph per segment
``max-autotune``       ``cpu``              :class:`InductorCpu`: Inductor C++, plain or frozen
``max-autotune``       ``cuda``             :class:`InductorCudaGraph`: Inductor Triton + CUDA graph
=====================  ===================  ==========================================================

The CUDA rows add cut rules: CPU work in a CUDA scope, and a collective a CUDA graph cannot
capture (:mod:`.collectives`: anything but NCCL >= 2.9.6). Unscoped runs and cut operators are realized by the same row (by default: operator by
operator). A device kind without a row of its own uses the mode's ``cpu`` row, as every
non-CUDA device always has. :func:`realization_for` is the one place the mode is read;
:func:`register` adds a row (a new device kind, or a replacement): one class, one row.
"""

from __future__ import annotations

from superkernel.config import MAX_AUTOTUNE, MODES, REDUCE_OVERHEAD, CompilerConfig
from superkernel.runtime.realizations.base import GraphContext, Job, PartitionLike, Program, Realization
from superkernel.runtime.realizations.cpu_rows import CpuNative
from superkernel.runtime.realizations.cuda_rows import CPU_IN_CUDA, CudaGraphReplay, InductorCudaGraph, cpu_in_cuda_reason
from superkernel.runtime.realizations.inductor_rows import Inductor, InductorCpu
from superkernel.runtime.realizations.static import NullStaticCompiler, StaticCompilerSeam

#: (mode, device kind) -> the realization class of its partitions
REALIZATIONS: dict[tuple[str, str], type[Realization]] = {
    (REDUCE_OVERHEAD, "cpu"): CpuNative,
    (REDUCE_OVERHEAD, "cuda"): CudaGraphReplay,
    (MAX_AUTOTUNE, "cpu"): InductorCpu,
    (MAX_AUTOTUNE, "cuda"): InductorCudaGraph,
}
_BUILT_IN = dict(REALIZATIONS)


def register(mode: str, device: str, realization: type[Realization]) -> None:
    """Realize partitions of graphs on ``device`` (a torch device type, e.g. ``"xpu"``) compiled in
    ``mode`` with ``realization`` (a :class:`Realization` subclass); replaces the row if there is one."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    if not isinstance(device, str) or not device or not device.isidentifier():
        raise ValueError(f"device must be a torch device type such as 'cpu' or 'xpu', got {device!r}")
    if not (isinstance(realization, type) and issubclass(realization, Realization)):
        raise TypeError(f"realization must be a subclass of superkernel.runtime.realizations.Realization, "
                        f"got {realization!r}")
    REALIZATIONS[(mode, device)] = realization


def unregister(mode: str, device: str) -> None:
    """Remove a registered row; a built-in row is put back as it was."""
    REALIZATIONS.pop((mode, device), None)
    if (mode, device) in _BUILT_IN:
        REALIZATIONS[(mode, device)] = _BUILT_IN[(mode, device)]


def realization_for(config: CompilerConfig, device: str) -> type[Realization]:
    """The row of ``config.mode`` for graphs on ``device`` (the mode's ``cpu`` row when it has none)."""
    mode = config.mode
    row = REALIZATIONS.get((mode, device)) or REALIZATIONS.get((mode, "cpu"))
    if row is None:
        raise ValueError(f"no realization for mode {mode!r} on device {device!r}; registered: "
                         + ", ".join(f"{m}/{d}" for m, d in sorted(REALIZATIONS)))
    return row


__all__ = [
    "CPU_IN_CUDA", "REALIZATIONS", "CpuNative", "CudaGraphReplay", "GraphContext", "Inductor", "InductorCpu",
    "InductorCudaGraph", "Job", "NullStaticCompiler", "PartitionLike", "Program", "Realization",
    "StaticCompilerSeam", "cpu_in_cuda_reason", "realization_for", "register", "unregister",
]
