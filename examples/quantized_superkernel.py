"""The seed's SuperKernel example in PyTorch: a W8A8 quantized matmul and a dequant-SwiGLU-quant, one superkernel.

TorchAir's page shows ``npu_quant_matmul`` (int8 x int8 with per-channel and per-token scales) followed by
``npu_dequant_swiglu_quant``, marked ``with torchair.scope.super_kernel("sp1", "")``, compiled, and checked
bit-identical against the same model compiled without the scope. The same program with ATen operators:

    python examples/quantized_superkernel.py            # reduce-overhead: bit-identical, as on the page
    python examples/quantized_superkernel.py --mode max-autotune   # fused by Inductor, within tolerance

(Shapes are smaller than the page's 864 x 7168 x 4096 so that it runs in seconds on a laptop CPU;
``--m/--k/--n`` take the page's.)
"""

from __future__ import annotations

import argparse

import torch

import superkernel as sk


def quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, pertoken_scale: torch.Tensor,
                 output_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """int8 ``x1 [m, k]`` @ int8 ``x2 [n, k]``^T in int32, dequantized by the weight's per-channel ``scale [n]``
    and the activation's ``pertoken_scale [m]`` (the page's ``npu_quant_matmul``)."""
    acc = torch._int_mm(x1, x2.t())
    return (acc.float() * scale * pertoken_scale[:, None]).to(output_dtype)


def dequant_swiglu_quant(x: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize by ``weight_scale``, SwiGLU over the two halves of the last dimension, and quantize the
    result to int8 with one dynamic scale per token (the page's ``npu_dequant_swiglu_quant``)."""
    x = x.float() * weight_scale
    gate, up = x.chunk(2, dim=-1)
    y = torch.nn.functional.silu(gate) * up
    token_scale = y.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127.0
    q = torch.clamp(torch.round(y / token_scale), -128, 127).to(torch.int8)
    return q, token_scale.squeeze(-1)


class ModelOrigin(torch.nn.Module):
    def forward(self, x1, x2, scale, pertoken_scale, weight_scale):
        quant_matmul_res = quant_matmul(x1, x2, scale, pertoken_scale)
        swiglu_res = dequant_swiglu_quant(quant_matmul_res, weight_scale)
        return swiglu_res, quant_matmul_res


class ModelSuperKernel(torch.nn.Module):
    def forward(self, x1, x2, scale, pertoken_scale, weight_scale):
        # the quantized matmul and dequant-SwiGLU-quant fused as one superkernel, marked sp1
        with sk.super_kernel("sp1", ""):
            quant_matmul_res = quant_matmul(x1, x2, scale, pertoken_scale)
            swiglu_res = dequant_swiglu_quant(quant_matmul_res, weight_scale)
            return swiglu_res, quant_matmul_res


def inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(-10, 10, (m, k), dtype=torch.int8, generator=g)
    x2 = torch.randint(-10, 10, (n, k), dtype=torch.int8, generator=g)
    scale = torch.rand(n, generator=g) * 1e-2
    pertoken_scale = torch.rand(m, generator=g) * 1e-2
    weight_scale = torch.rand(m, n, generator=g) + 0.5
    return x1, x2, scale, pertoken_scale, weight_scale


def run(mode: str = "reduce-overhead", m: int = 16, k: int = 1024, n: int = 512) -> bool:
    """Compile both models with the superkernel backend and compare; True when the check passes
    (reduce-overhead: bit-identical; max-autotune: within 1 int8 step and bf16 rounding)."""
    cfg = sk.CompilerConfig()
    cfg.mode = mode
    args = inputs(m, k, n)
    with torch.no_grad():
        model_no_sk = sk.compile(ModelOrigin(), cfg)
        (q_origin, s_origin), mm_origin = model_no_sk(*args)
        model_sk = sk.compile(ModelSuperKernel(), cfg)
        (q_sk, s_sk), mm_sk = model_sk(*args)
    if mode == "reduce-overhead":
        ok = torch.equal(q_origin, q_sk) and torch.equal(s_origin, s_sk) and torch.equal(mm_origin, mm_sk)
    else:
        ok = bool((q_origin.int() - q_sk.int()).abs().max() <= 1) and torch.allclose(mm_origin.float(), mm_sk.float(),
                                                                                      rtol=1e-2, atol=1e-2)
    print(sk.explain(model_sk))
    print("Precision ====== Success!!!" if ok else "Precision ====== Failed.")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="reduce-overhead", choices=["reduce-overhead", "max-autotune"])
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=512)
    args = parser.parse_args()
    if args.n % 2:
        parser.error("--n must be even (SwiGLU halves)")
    return 0 if run(args.mode, args.m, args.k, args.n) else 1


if __name__ == "__main__":
    raise SystemExit(main())
