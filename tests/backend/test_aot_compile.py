"""A superkernel backend under Dynamo's AOT compile (vLLM's default compile path, issue 60): it used to fail
inside AOTAutograd with ``AssertionError: expected OutputCode, got GraphModule``; now the step compiles, runs
bit-exact with the exactness reference, and refuses serialization with its reason."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk

aot_types = pytest.importorskip("torch._dynamo.aot_compile_types")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        with sk.super_kernel("mlp"):
            return x + self.down(torch.nn.functional.silu(self.up(x)))


def _aot(model, cfg, x):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(model.forward, fullgraph=True, dynamic=False, backend=sk.get_backend(cfg))
        return compiled.aot_compile(((x,), {}))


def test_reduce_overhead_under_aot_compile_is_exact_and_not_serialized(tmp_path):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(2, 32)
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    with torch.no_grad():
        fn = _aot(model, cfg, x)
        got = fn(model, x)
        ref = _aot(model, sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}}),
                   x)(model, x)
    assert torch.equal(got, ref)
    assert torch.equal(got, model(x))  # a flat ATen program of the same kernels as eager here
    with pytest.raises(Exception, match="not serialized into Dynamo's AOT artifact"):
        fn.save_compiled_function(str(tmp_path / "artifact"))
