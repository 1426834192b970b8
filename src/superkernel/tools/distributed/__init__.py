"""Tensor-parallel decode for the superkernel workflow: launcher, sharding, synced timing, report.

See docs/distributed.md. ``apply_tensor_parallel`` shards a model (a transformers
``tp_plan`` or a user-given one) for the current rank of an initialized job. Imported lazily:
the command line's parser reads ``distributed.nproc`` without importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STYLES", "Sharded", "TensorParallelError", "apply_tensor_parallel", "model_plan"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from superkernel.tools.distributed import tp

    value = getattr(tp, name)
    globals()[name] = value
    return value
