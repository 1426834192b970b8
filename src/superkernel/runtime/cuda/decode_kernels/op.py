"""``superkernel::llama_decode_layer``: one Llama decode layer of the kernel set as one PyTorch operator.

The hookup (``hookup.py``) calls it from a covered layer's forward, so Dynamo traces the layer as this one node (it
mutates the layer's K and V cache, which AOTAutograd's functionalization and superkernel's in-place input pass
carry like the ``index_copy_`` of ``StaticCache.update``), and Inductor's max-autotune compiles only the glue around
it; the layer's six launches (``layer.decode_layer``) run inside the step's one CUDA graph.

A ``torch.library.custom_op`` (opaque to Inductor), not a ``triton_op``: the step replays as one CUDA graph, so the
launchers' Python runs only while the graph is captured, and Inductor has nothing to fuse across the layer's edges
that the kernels do not already fuse. (A ``triton_op`` would let Inductor see the kernels; worth it only if a
measurement shows the boundary costs.) ``import`` registers the operator; the kernels import Triton when it runs.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape

OP_NAME = "superkernel::llama_decode_layer"


@torch.library.custom_op(OP_NAME, mutates_args=("k_cache", "v_cache"))
def llama_decode_layer(x: torch.Tensor, input_norm: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor,
                       post_norm: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                       s_qkv: Optional[torch.Tensor], s_o: Optional[torch.Tensor], s_gate: Optional[torch.Tensor],
                       s_up: Optional[torch.Tensor], s_down: Optional[torch.Tensor], cos: torch.Tensor,
                       sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       n_q_heads: int, n_kv_heads: int, head_dim: int, eps: float,
                       sm_scale: float) -> torch.Tensor:
    """x ``[1, 1, H]`` -> the layer's output ``[1, 1, H]``; writes K and V at ``pos`` (a one-element integer device
    tensor) of the caches ``[1, Hkv, S, D]`` and attends over positions ``0 .. pos``. ``s_*``: int8 weights' scales
    (all None for bfloat16 weights)."""
    from superkernel.runtime.cuda.decode_kernels.layer import LayerWeights, decode_layer

    shape = DecodeShape(hidden=x.shape[-1], n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                        intermediate=w_gate.shape[0], vocab=0, kv_len=k_cache.shape[-2], eps=eps)
    weights = LayerWeights(input_norm, w_qkv, w_o, post_norm, w_gate, w_up, w_down, s_qkv, s_o, s_gate, s_up, s_down)
    pos = pos.reshape(1)
    out = decode_layer(x.reshape(-1), weights, cos, sin, pos, pos + 1, k_cache, v_cache, shape, sm_scale=sm_scale)
    return out.view(x.shape)


@llama_decode_layer.register_fake
def _(x, input_norm, w_qkv, w_o, post_norm, w_gate, w_up, w_down, s_qkv, s_o, s_gate, s_up, s_down, cos, sin, pos,
      k_cache, v_cache, n_q_heads, n_kv_heads, head_dim, eps, sm_scale):  # noqa: ARG001 (the signature is the op's)
    return torch.empty_like(x)


def layers_in(gm: Any) -> int:
    """How many ``llama_decode_layer`` calls an ATen graph holds (functionalized: inside ``auto_functionalized``)."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if getattr(target, "__name__", "").startswith("auto_functionalized") and node.args:
            target = node.args[0]
        if getattr(target, "name", lambda: "")() in (OP_NAME, OP_NAME + ".default") or str(target) in (
                OP_NAME.replace("::", "."), OP_NAME.replace("::", ".") + ".default"):
            count += 1
    return count


def describe(layers: int) -> str:
    """The explain line of a partition whose decode layers run through the set."""
    return f"decode kernel set: {layers} layer(s) as {OP_NAME} (six Triton launches each)"
