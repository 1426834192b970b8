"""Small ATen graphs and models shared by the autofusion tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import superkernel as sk


def aten_graph(fn, *args):
    """``fn`` traced to ATen with Inductor's decompositions (a Linear becomes permute + mm/addmm), fake values in meta."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)


def qkv(x, wq, wk, wv):
    y = x.view(-1, x.shape[-1])
    return F.linear(y, wq), F.linear(y, wk), F.linear(y, wv)


def qkv_bias(x, wq, wk, wv, bq, bk, bv):
    return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)


def weights(k: int, ns: list[int], bias: bool = False, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ws = [torch.randn(n, k, generator=gen) / k ** 0.5 for n in ns]
    return ws + ([torch.randn(n, generator=gen) for n in ns] if bias else [])


class Layer(torch.nn.Module):
    """RMSNorm -> q/k/v -> residual add -> gate/up SwiGLU -> down -> residual add, in one scope."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(h)
        self.q = torch.nn.Linear(h, h, bias=False)
        self.k = torch.nn.Linear(h, h // 2, bias=False)
        self.v = torch.nn.Linear(h, h // 2, bias=False)
        self.gate = torch.nn.Linear(h, 2 * h, bias=False)
        self.up = torch.nn.Linear(h, 2 * h, bias=False)
        self.down = torch.nn.Linear(2 * h, h, bias=False)

    def forward(self, x):
        with sk.super_kernel("layer"):
            y = self.norm(x)
            x = x + self.q(y) + torch.cat([self.k(y), self.v(y)], -1)
            return x + self.down(F.silu(self.gate(x)) * self.up(x))
