"""``superkernel static-compile --nproc N``: one static-kernel package per node for a tensor-parallel job.

Every rank loads the model and shards it by its plan. Then, per batch size:

1. **Build (the node leader, LOCAL_RANK 0).** It compiles the decode step with static
   kernels on (taking the build directory's lock) and runs one step, which builds every
   partition, the step's frame and writes the package. The other ranks of the node do not
   compile: they run the same step eagerly, which issues the same collectives in the same
   order, so the leader's all-reduces have their partners.
2. **Barrier**, then **every rank runs the step from the package**: the other ranks compile
   it with static kernels on and load it (``counters["compiled"] == 0``), the leader runs
   what it built.

This works because a rank's graph does not depend on its rank: every rank holds shards of
the same shapes, weights are inputs of the compiled partitions (never in a package), and
the sharding keeps rank-dependent values in buffers (``tp.py``), so the package's keys are
the same on every rank of a layout. The world size and ranks per node are part of the
package's environment: a package for another world size is an error unless ``--rebuild``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from superkernel.config import REDUCE_OVERHEAD
from superkernel.tools.distributed import job as jobs


@dataclass
class StaticBuildOptions:
    model: str
    build_dir: Path
    batch_sizes: list[int]
    plan: Path | None
    mode: str | None
    prompt_len: int
    max_cache_len: int | None
    seed: int
    threads: int | None
    tp_plan: dict[str, str] | None
    tp_plan_source: str
    as_json: bool = False


def default_threads(local_world_size: int) -> int:
    """Torch threads per rank: this node's cores shared by its ranks (a frame is tied to the count)."""
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _explain(step: Any) -> dict[str, Any]:
    import superkernel

    ex = superkernel.explain(step)
    return {"segments": len(ex.segments), "realizations": sorted({s.realization or "?" for s in ex.segments})}


def check_mode(mode: str | None, plan: Path | None) -> str:
    """The mode a tensor-parallel package is built in: reduce-overhead (the default), else a one-line error."""
    if mode is None and plan is not None:
        from superkernel.tools.advisor.plan_file import read_plan

        mode = read_plan(plan).mode
    mode = mode or REDUCE_OVERHEAD
    if mode != REDUCE_OVERHEAD:
        raise ValueError(f"static-compile --nproc builds reduce-overhead packages only (got {mode}): TorchInductor "
                         "in torch 2.13 cannot compile the collectives of a tensor-parallel step on CPU "
                         "(docs/distributed.md); use --mode reduce-overhead")
    return mode


def build_rank(o: StaticBuildOptions) -> int:
    """One rank's part; returns the exit status (0: the package serves every rank)."""
    import superkernel
    from superkernel.pipeline.backend import find_backend
    from superkernel.tools.distributed.tp import apply_tensor_parallel, model_plan
    from superkernel.tools.models import load_model
    from superkernel.static_kernel.store import check_layout
    from superkernel.tools.static_session import batch_inputs, build_config, decode_session

    job = jobs.join(torch.device("cpu"))
    leader = job.env.is_node_leader
    try:
        torch.set_num_threads(o.threads or default_threads(job.env.local_world_size))
        loaded = load_model(o.model, seed=o.seed, device="cpu")
        cfg, sizes = build_config(loaded.model, o.build_dir, batch_sizes=o.batch_sizes, plan=o.plan,
                                  mode=check_mode(o.mode, o.plan))
        check_layout(cfg, o.build_dir)  # on every rank, before any of them compiles or waits
        plan_used = dict(o.tp_plan) if o.tp_plan is not None else model_plan(loaded.model)
        sharded = apply_tensor_parallel(loaded.model, plan_used, strict=o.tp_plan is not None)
        cache_len = o.max_cache_len or o.prompt_len + 36
        mine: dict[str, Any] = {"rank": job.rank, "local_rank": job.env.local_rank, "builder": leader,
                                "threads": torch.get_num_threads(), "batches": []}
        for batch in sizes:
            session = decode_session(loaded.model, batch=batch, prompt_len=o.prompt_len, max_cache_len=cache_len,
                                     seed=o.seed, device="cpu")
            ids, pos = batch_inputs(session, 0, batch)
            step = backend = None
            with torch.no_grad():
                if leader:  # builds (or loads) under the build directory's lock
                    step = superkernel.compile(session.step_fn(), cfg)
                    backend = find_backend(step)
                    backend.static_kernels.extend = True
                    step(ids, pos)
                    backend.static_kernels.finalize()
                else:  # the builder's collective partner: the same step, eagerly
                    session.step_fn()(ids, pos)
                session.restore_cache()
                torch.distributed.barrier(group=job.handoff)
                traced = _dynamo_graphs()
                if not leader:  # every other rank starts from the package
                    step = superkernel.compile(session.step_fn(), cfg)
                    backend = find_backend(step)
                out = step(ids, pos)
                traced = _dynamo_graphs() - traced
                session.restore_cache()
            static = backend.static_kernels
            mine["batches"].append({
                "batch": batch, "logits_sha256": _digest(out), "dynamo_graphs": traced,
                "counters": {k: int(v) for k, v in static.counters.items()},
                "package": str(static.package.path) if static.package is not None else None,
                "written": [str(p) for p in static.packages_written], "notices": list(static.notices),
                **_explain(step)})
            torch._dynamo.reset()
        gathered = jobs.gather_json(mine, job)
        ok = all(_served(b) for g in gathered for b in g["batches"])
        if job.is_main:
            _print(o, job, gathered, sharded, plan_used, ok)
        torch.distributed.barrier(group=job.handoff)
        return 0 if ok else 1
    finally:
        jobs.leave()


def _dynamo_graphs() -> int:
    """Graphs Dynamo has traced in this process (a step served by a precompiled frame traces none)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _served(batch: dict[str, Any]) -> bool:
    """The rank ran the step from a package (its own build or a load): nothing compiled the normal way, the
    step's frame from the package, and no Dynamo trace when the rank ran the step from the package."""
    c = batch["counters"]
    return (batch["package"] is not None and not c.get("fallback") and not c.get("build_failed")
            and not c.get("native_fallback") and bool(c.get("frames_loaded") or c.get("frames_built"))
            and batch["dynamo_graphs"] == 0)


def _print(o: StaticBuildOptions, job: jobs.Job, gathered: list[dict], sharded: Any, plan: dict, ok: bool) -> None:
    import json

    env = job.env
    packages = sorted({b["package"] for g in gathered for b in g["batches"] if b["package"]})
    summary = {"model": o.model, "world_size": env.world_size, "local_world_size": env.local_world_size,
               "backend": job.backend, "tp_plan_source": o.tp_plan_source, "sharded": len(sharded.applied),
               "packages": packages, "served_every_rank": ok, "ranks": gathered}
    if o.as_json:
        print(json.dumps(summary, indent=1), flush=True)
        return
    print(f"tensor-parallel static build: {env.world_size} ranks ({job.backend}), {env.local_world_size} per node; "
          f"plan: {o.tp_plan_source}, {len(sharded.applied)} modules/parameters sharded")
    print(f"package: {', '.join(packages) or '(none)'}")
    for g in gathered:
        for b in g["batches"]:
            c = b["counters"]
            role = "built" if g["builder"] else "loaded"
            print(f"  rank {g['rank']} (local {g['local_rank']}, {role}) batch {b['batch']}: "
                  f"{c.get('compiled', 0)} partitions compiled, {c.get('loaded', 0)} loaded, "
                  f"{c.get('frames_built', 0)} frames built, {c.get('frames_loaded', 0)} loaded, "
                  f"{c.get('native_built', 0)} native modules built, {c.get('native_loaded', 0)} loaded, "
                  f"{c.get('fallback', 0) + c.get('native_fallback', 0)} compiled outside the package, "
                  f"{b['dynamo_graphs']} Dynamo traces in the served step; segments {b['segments']} "
                  f"({', '.join(b['realizations'])}); logits sha256 {b['logits_sha256']}")
    if not ok:
        print("  NOT every rank ran from the package (see the counters above)", file=sys.stderr)
