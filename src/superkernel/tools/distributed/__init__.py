"""Tensor-parallel decode for the superkernel workflow: launcher, sharding, synced timing, report.

See docs/distributed.md. ``apply_tensor_parallel`` shards a model (a transformers
``tp_plan`` or a user-given one) for the current rank of an initialized job.
"""

from superkernel.tools.distributed.tp import STYLES, Sharded, TensorParallelError, apply_tensor_parallel, model_plan

__all__ = ["STYLES", "Sharded", "TensorParallelError", "apply_tensor_parallel", "model_plan"]
