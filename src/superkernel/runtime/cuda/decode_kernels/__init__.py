"""A decode kernel set of our own for Llama-style layers at batch 1 (issue 61): Triton kernels that fuse what
Inductor launches as ~14 kernels per layer into about five, for max-autotune on CUDA.

Not yet measured on hardware: opt-in through ``CompilerConfig.experimental_config.cuda_decode_kernels`` (default
off), which hooks a covered Hugging Face Llama's decoder layers up to the set (``hookup``); docs/gpu.md, "Decode kernel
set (not yet measured on hardware)", says what was checked on the CPU and what the prepared GPU run measures.

One module per job:

* ``reference``: float64 PyTorch references of every kernel and the bfloat16 tolerance they are checked with;
* ``gemv``: a GEMV with an optional RMSNorm prologue, an optional residual epilogue and optional split-K
  (o-projection + residual, down projection + residual, final RMSNorm + lm_head);
* ``gate_up``: RMSNorm + gate/up GEMV + SiLU(gate) * up;
* ``qkv_rope``: RMSNorm + fused QKV GEMV + RoPE + the new K and V written into the static KV cache;
* ``attention``: GQA decode attention over the static cache, split along the sequence, then a reduction;
* ``configs``: the launch parameters per kernel and shape, and the signatures they are compiled with ahead of time;
* ``norm_prologue``: the RMSNorm-prologue K loop gate_up and qkv_rope share;
* ``layer``: a decode layer as six launches (bfloat16 or int8 weight-only weights) and its float64 reference;
* ``coverage`` (no Triton): which models and steps the set covers, and the reason where not;
* ``op``: ``superkernel::llama_decode_layer``, a layer as one PyTorch operator; ``hookup``: a model's decoder layers
  calling it on decode steps.

Every weight-reading kernel also takes int8 weights with a float32 scale per output channel (int8 weight-only).

The kernel modules import Triton; this package and ``reference`` do not (``triton_available()`` says whether the
kernels can be used in this process).
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether Triton can be imported here (torch's CUDA builds ship it; the CPU build does not)."""
    return importlib.util.find_spec("triton") is not None
