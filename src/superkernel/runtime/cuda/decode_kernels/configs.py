"""The shapes the kernel set is built for and the launch parameters tried per kernel.

``LLAMA_1B`` is Llama-3.2-1B (the model of the GPU runs of 2026-11-27); the benchmark's step keeps a static cache
of 162 positions (32 prompt tokens, 1 warm-up and 128 timed steps, 1 spare), so attention runs at KV lengths
33-161. ``CANDIDATES`` are the launch parameters each kernel is compiled with ahead of time (their registers and
spills recorded) and timed with on the card: the first of each list is the default until a card has measured
them (none has yet). The defaults were picked from the sm_90a compile
(``benchmarks/results/triton_decode_kernels_sm90a.md``): where two tiles read as many bytes per loop step, the one
with fewer registers per thread (more programs resident per SM, more loads in flight), e.g. qkv_rope's 4 x 1024 tile
at 96 registers over 8 x 512 at 161.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    kv_len: int  # the static cache's length
    eps: float = 1e-5

    @property
    def qkv_rows(self) -> int:
        return (self.n_q_heads + 2 * self.n_kv_heads) * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """(N, K) of every GEMV of a layer and the head."""
        return {"qkv": (self.qkv_rows, self.hidden), "o_proj": (self.hidden, self.n_q_heads * self.head_dim),
                "gate_up": (2 * self.intermediate, self.hidden), "down": (self.hidden, self.intermediate),
                "lm_head": (self.vocab, self.hidden)}


LLAMA_1B = DecodeShape(hidden=2048, n_q_heads=32, n_kv_heads=8, head_dim=64, intermediate=8192, vocab=128256,
                       kv_len=162)
#: Llama-3.2-1B has 16 layers; a step runs each layer's kernels once, then the head.
LLAMA_1B_LAYERS = 16

#: Per kernel of the set, the keyword arguments of its launcher (``qkv_rope.qkv_rope``, ``gemv.gemv``, ...) tried.
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "qkv_rope": [dict(block_p=4, block_k=1024, num_warps=4), dict(block_p=8, block_k=512, num_warps=4),
                 dict(block_p=16, block_k=256, num_warps=4), dict(block_p=8, block_k=1024, num_warps=8)],
    "o_proj": [dict(block_n=8, block_k=512, num_warps=4), dict(block_n=4, block_k=1024, num_warps=4),
               dict(block_n=16, block_k=256, num_warps=4), dict(block_n=4, block_k=512, num_warps=4, split_k=2)],
    "gate_up": [dict(block_n=4, block_k=512, num_warps=4), dict(block_n=8, block_k=512, num_warps=8),
                dict(block_n=2, block_k=1024, num_warps=4), dict(block_n=16, block_k=256, num_warps=8)],
    "down": [dict(block_n=8, block_k=512, num_warps=4), dict(block_n=4, block_k=1024, num_warps=4),
             dict(block_n=8, block_k=1024, num_warps=8), dict(block_n=8, block_k=512, num_warps=4, split_k=4)],
    "lm_head": [dict(block_n=32, block_k=256, num_warps=8, split_k=2), dict(block_n=16, block_k=512, num_warps=4),
                dict(block_n=8, block_k=1024, num_warps=4), dict(block_n=16, block_k=512, num_warps=4, split_k=2)],
    "attention": [dict(splits=8, block_s=64, num_warps=4), dict(splits=16, block_s=32, num_warps=4),
                  dict(splits=4, block_s=64, num_warps=4), dict(splits=32, block_s=16, num_warps=4)],
}


def describe(launch: dict[str, Any]) -> str:
    """``block_n=8,block_k=512,num_warps=4``: a candidate's name in tables."""
    return ",".join(f"{k}={v}" for k, v in launch.items())
