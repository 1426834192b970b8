"""Each kernel of the set as a problem at a shape: inputs (random, or empty on the ``meta`` device for compiling
ahead of time), the call of its launcher with given launch parameters, and its float64 reference. The tests, the
sm_90a compile and the GPU benchmark all go through these, so they check and time the same calls.

Names: ``qkv_rope``, ``attention``, ``o_proj`` (GEMV + residual), ``gate_up``, ``down`` (GEMV + residual),
``lm_head`` (final RMSNorm + GEMV).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from superkernel.runtime.cuda.decode_kernels import reference
from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape

NAMES = ("qkv_rope", "attention", "o_proj", "gate_up", "down", "lm_head")
#: The problems that read weights: each also runs int8 weight-only (``make_inputs(..., int8=True)``).
WEIGHTED = ("qkv_rope", "o_proj", "gate_up", "down", "lm_head")
#: The weight keys of a problem's inputs and the keyword of each one's per-channel scale.
_SCALE_OF = {"w_qkv": "scale", "w": "scale", "w_gate": "scale_gate", "w_up": "scale_up"}


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of ``w`` ``[N, K]``, as torchao's int8 weight-only makes it: (int8 ``[N,
    K]``, float32 scale ``[N]``), ``w ~ q * scale[:, None]``."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(wf / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


def weight64(inputs: dict[str, Any], key: str) -> torch.Tensor:
    """The float64 weight a kernel computes with: the bfloat16 weight, or an int8 one times its scale."""
    w = inputs[key].detach().to("cpu", torch.float64)
    scale = inputs.get(_SCALE_OF[key])
    return w * scale.detach().to("cpu", torch.float64).reshape(-1, 1) if scale is not None else w


def make_inputs(name: str, shape: DecodeShape, device: str | torch.device = "cpu", *, seed: int = 0,
                rows: int | None = None, length: int | None = None, int8: bool = False) -> dict[str, Any]:
    """Inputs of ``name`` at ``shape`` in bfloat16; ``rows``: only the first output rows of a GEMV (its real K:
    how the interpreter checks the biggest weights in reasonable time); ``length``: attention's KV length
    (default: the cache full but one slot); ``int8``: the weights int8 weight-only (:func:`quantize_int8` of the
    bfloat16 ones), each with its float32 per-channel scale under :data:`_SCALE_OF`'s keyword."""
    if int8:
        if name not in WEIGHTED:
            raise ValueError(f"{name} reads no weight: no int8 form")
        inputs = make_inputs(name, shape, device, seed=seed, rows=rows, length=length)
        for key, scale_key in _SCALE_OF.items():
            if key in inputs:
                if inputs[key].device.type == "meta":
                    n = inputs[key].shape[0]
                    inputs[key] = torch.empty(inputs[key].shape, dtype=torch.int8, device=inputs[key].device)
                    inputs[scale_key] = torch.empty(n, dtype=torch.float32, device=inputs[key].device)
                else:
                    inputs[key], inputs[scale_key] = quantize_int8(inputs[key])
        return inputs
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    meta = device.type == "meta"

    def rand(*size: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        if meta:
            return torch.empty(size, dtype=torch.bfloat16, device=device)
        return (torch.randn(size, generator=gen) * scale + offset).to(device, torch.bfloat16)

    h, d = shape.hidden, shape.head_dim
    if name == "attention":
        n = shape.kv_len - 1 if length is None else length
        return {"q": rand(shape.n_q_heads, d), "k_cache": rand(1, shape.n_kv_heads, shape.kv_len, d),
                "v_cache": rand(1, shape.n_kv_heads, shape.kv_len, d),
                "length": torch.tensor([n], device=device) if not meta else torch.empty(1, dtype=torch.int64,
                                                                                        device=device)}
    if name == "qkv_rope":
        pos = (shape.kv_len - 2) if length is None else length - 1
        angles = torch.rand(d // 2, generator=gen) * 2 * math.pi
        cos, sin = torch.cat([angles.cos()] * 2), torch.cat([angles.sin()] * 2)
        return {"x": rand(h), "norm": rand(h, scale=0.1, offset=1.0), "w_qkv": rand(shape.qkv_rows, h,
                                                                                    scale=h ** -0.5),
                "cos": cos.to(device, torch.bfloat16), "sin": sin.to(device, torch.bfloat16),
                "pos": torch.tensor([pos], device=device) if not meta else torch.empty(1, dtype=torch.int64,
                                                                                      device=device),
                "k_cache": torch.zeros(1, shape.n_kv_heads, shape.kv_len, d, dtype=torch.bfloat16, device=device),
                "v_cache": torch.zeros(1, shape.n_kv_heads, shape.kv_len, d, dtype=torch.bfloat16, device=device)}
    n, k = shape.projections()[name]
    if name == "gate_up":
        n //= 2
    n = min(n, rows) if rows else n
    inputs: dict[str, Any] = {"x": rand(k)}
    if name == "gate_up":
        inputs.update(norm=rand(k, scale=0.1, offset=1.0), w_gate=rand(n, k, scale=k ** -0.5),
                      w_up=rand(n, k, scale=k ** -0.5))
    elif name == "lm_head":
        inputs.update(norm=rand(k, scale=0.1, offset=1.0), w=rand(n, k, scale=k ** -0.5))
    else:  # o_proj, down: GEMV + residual
        inputs.update(w=rand(n, k, scale=k ** -0.5), residual=rand(n))
    return inputs


def call(name: str, inputs: dict[str, Any], shape: DecodeShape, launch: dict[str, Any] | None = None) -> Any:
    """Run ``name``'s launcher on ``inputs`` with ``launch`` (its keyword arguments: blocks, warps, splits)."""
    launch = dict(launch or {})
    launch.update({k: inputs[k] for k in set(_SCALE_OF.values()) if k in inputs})  # int8 weights' scales
    if name == "qkv_rope":
        from superkernel.runtime.cuda.decode_kernels.qkv_rope import qkv_rope
        return qkv_rope(inputs["x"], inputs["norm"], inputs["w_qkv"], inputs["cos"], inputs["sin"], inputs["pos"],
                        inputs["k_cache"], inputs["v_cache"], n_q_heads=shape.n_q_heads,
                        n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, eps=shape.eps, **launch)
    if name == "attention":
        from superkernel.runtime.cuda.decode_kernels.attention import decode_attention
        return decode_attention(inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["length"], **launch)
    if name == "gate_up":
        from superkernel.runtime.cuda.decode_kernels.gate_up import gate_up
        return gate_up(inputs["x"], inputs["norm"], inputs["w_gate"], inputs["w_up"], eps=shape.eps, **launch)
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv
    if name == "lm_head":
        return gemv(inputs["x"], inputs["w"], norm=inputs["norm"], eps=shape.eps, **launch)
    return gemv(inputs["x"], inputs["w"], residual=inputs["residual"], **launch)


def expected(name: str, inputs: dict[str, Any], shape: DecodeShape) -> dict[str, torch.Tensor]:
    """Float64 references of what ``call`` returns or writes, by output name."""
    if name == "qkv_rope":
        q, k, v = reference.qkv_rope(inputs["x"], inputs["norm"], weight64(inputs, "w_qkv"), inputs["cos"],
                                     inputs["sin"], shape.n_q_heads, shape.n_kv_heads, shape.head_dim, shape.eps)
        return {"q": q, "k": k, "v": v}
    if name == "attention":
        return {"out": reference.decode_attention(inputs["q"], inputs["k_cache"][0], inputs["v_cache"][0],
                                                  int(inputs["length"].item()))}
    if name == "gate_up":
        return {"out": reference.gate_up(inputs["x"], inputs["norm"], weight64(inputs, "w_gate"),
                                         weight64(inputs, "w_up"), shape.eps)}
    if name == "lm_head":
        return {"out": reference.gemv(inputs["x"], weight64(inputs, "w"), norm=inputs["norm"], eps=shape.eps)}
    return {"out": reference.gemv(inputs["x"], weight64(inputs, "w"), residual=inputs["residual"])}


def produced(name: str, inputs: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    """What ``call`` produced, by the names of :func:`expected`; qkv_rope's k and v are the cache rows it wrote."""
    if name == "qkv_rope":
        pos = int(inputs["pos"].item())
        return {"q": result, "k": inputs["k_cache"][0, :, pos], "v": inputs["v_cache"][0, :, pos]}
    return {"out": result}


#: The floor of the tolerance for the eager PyTorch forms (``eager.py``): they round to bfloat16 between operators
#: as a Llama layer does (normalized x, the product, each RoPE term: up to five roundings of values as large as the
#: output), where the kernels round once.
EAGER_FLOOR = 1e-2


def check(name: str, inputs: dict[str, Any], shape: DecodeShape, result: Any,
          floor: float = 2e-3) -> dict[str, float]:
    """Every output of ``name`` within the bfloat16 tolerance of its float64 reference (raises otherwise);
    returns each output's largest error as a fraction of its largest reference value."""
    want = expected(name, inputs, shape)
    got = produced(name, inputs, result)
    return {out: reference.check(f"{name}.{out}", got[out], want[out], floor) for out in want}
