"""One rank of the collectives-in-a-scope test (started by test_dist_scope.py with torchrun's variables).

A hand-written MLP sharded by a user-given plan (up colwise, down rowwise: one all-reduce),
its whole forward inside ``super_kernel("mlp")``, compiled under reduce-overhead (and once under
max-autotune: the result and whether the partition with the all-reduce was timed). Prints
``RESULT {json}``: bit-exactness to the exactness reference, the diff to the unsharded
model, segments, cuts, and which partition each collective node landed in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import superkernel
from superkernel import CompilerConfig, super_kernel
from superkernel.tools.distributed import apply_tensor_parallel


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        with super_kernel("mlp"):
            return x + self.down(F.silu(self.up(x)))


class Head(nn.Module):
    """An LM-head-like projection, sharded ``colwise_rep``: each rank computes its output features, all-gathered."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16)

    def forward(self, x):
        return self.proj(x)


def _abort_forward(model: MLP, x: torch.Tensor) -> torch.Tensor:
    with super_kernel("mlp", "strict-scope-check=abort"):
        return x + model.down(F.silu(model.up(x)))


def main() -> None:
    dump = Path(sys.argv[1]) / f"rank{os.environ['RANK']}"
    dump.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MLP().eval().requires_grad_(False)
    x = torch.randn(2, 32)
    with torch.no_grad():
        full = model(x)
        sharded = apply_tensor_parallel(model, {"up": "colwise", "down": "rowwise"})
        eager = model(x)
        ref_cfg = CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}})
        reference = superkernel.compile(model, ref_cfg)(x)
        torch._dynamo.reset()
        cfg = CompilerConfig.from_dict({"mode": "reduce-overhead",
                                        "debug": {"graph_dump": {"type": "txt", "path": str(dump)}}})
        fast = superkernel.compile(model, cfg)
        out = fast(x)
        again = fast(x + 1)
        reference_again = model(x + 1)
    ex = superkernel.explain(fast)
    with torch.no_grad():  # max-autotune: the segment holding the all-reduce is compiled plain, never timed
        torch._dynamo.reset()
        tuned = superkernel.compile(model, CompilerConfig.from_dict({"mode": "max-autotune"}))
        tuned_out = [tuned(x) for _ in range(3)]
        tuned_counters = dict(superkernel.pipeline.backend.find_backend(tuned).counters)
    with torch.no_grad():
        torch._dynamo.reset()
        abort = MLP().eval().requires_grad_(False)
        apply_tensor_parallel(abort, {"up": "colwise", "down": "rowwise"})
        abort.forward = lambda x: _abort_forward(abort, x)
        try:
            superkernel.compile(abort, CompilerConfig.from_dict({"mode": "reduce-overhead"}))(x)
            abort_error = None
        except Exception as exc:  # noqa: BLE001 - what strict-scope-check=abort raises
            abort_error = f"{type(exc).__name__}: {exc}"
    with torch.no_grad():  # the all-gather: one graph on every torch (2.11 broke the graph in its own helper)
        torch._dynamo.reset()
        head = Head().eval().requires_grad_(False)
        head_full = head(x)
        apply_tensor_parallel(head, {"proj": "colwise_rep"})
        head_out = torch.compile(head, fullgraph=True, backend="eager")(x)
    collectives = []
    for path in sorted(dump.rglob("*_segments.txt")):  # the dump that names each node's partition
        for line in path.read_text().splitlines():
            if "c10d_functional" in line:
                parts = line.split()
                collectives.append({"op": parts[3], "partition": parts[1]})
    print("RESULT " + json.dumps({
        "rank": rank, "sharded": sharded.applied, "up_rows": model.up.weight.shape[0],
        "bit_exact": torch.equal(out, reference), "eager_equal": torch.equal(reference, eager),
        "second_call_max_abs": float((again - reference_again).abs().max()),
        "vs_unsharded_max_abs": float((out - full).abs().max()),
        "segments": [(s.name, s.realization, s.fallback) for s in ex.segments], "cuts": len(ex.cuts),
        "collectives": collectives, "abort_error": abort_error,
        "gathered_head_shape": list(head_out.shape), "gathered_head_max_abs": float((head_out - head_full).abs().max()),
        "max_autotune_max_abs": max(float((o - eager).abs().max()) for o in tuned_out),
        "max_autotune_not_timed": tuned_counters.get("partitions_not_timed_collectives", 0),
        "max_autotune_frozen": tuned_counters.get("partitions_frozen", 0)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
