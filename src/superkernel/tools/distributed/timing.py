"""Decode steps timed on a barrier-synchronised clock, and the collectives' share of a step.

Every rank waits at a barrier before each step, so all ranks start step ``i`` together;
each then times its own step (the collectives inside keep them in lock-step). The job's
time for a step is the slowest rank's (:func:`job_step_ms`): that is when the token is
ready everywhere.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from superkernel.tools.decode import DecodeRun, DecodeSession, StepFn, run_decode, synchronize

#: Profiler event names of the collectives (functional ops, the c10d ops and their backends).
COLLECTIVE_MARKERS = ("all_reduce", "allreduce", "all_gather", "allgather", "wait_tensor", "c10d", "gloo", "nccl",
                      "broadcast", "reduce_scatter")


def run_synced(session: DecodeSession, step: StepFn, *, label: str = "", group=None) -> DecodeRun:
    """:func:`superkernel.tools.decode.run_decode` with a barrier before every step."""
    return run_decode(session, step, label=label, before_step=lambda: dist.barrier(group=group))


def job_step_ms(per_rank_seconds: list[list[float]], warmup: int) -> float:
    """Median over the timed steps of the slowest rank's time for each step, in ms."""
    steps = list(zip(*per_rank_seconds))[warmup:]
    slowest = sorted(max(s) for s in steps)
    if not slowest:
        return float("nan")
    mid = len(slowest) // 2
    value = slowest[mid] if len(slowest) % 2 else (slowest[mid - 1] + slowest[mid]) / 2
    return value * 1e3


def collective_share(session: DecodeSession, step: StepFn, *, steps: int = 8, group=None) -> dict:
    """Profile ``steps`` decode steps (already compiled) and return the time spent in collectives.

    ``share`` = self CPU time of collective events (:data:`COLLECTIVE_MARKERS`) inside the profiled
    steps / wall time of those steps. On CPU the gloo work runs in the calling thread or is waited
    for in ``wait_tensor``, so it shows as CPU time of those events.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    session.restore_cache()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    wall = 0.0
    steps = min(steps, session.total_steps)
    with torch.no_grad(), session.dynamo_config(), profile(activities=activities) as prof:
        for i in range(steps):
            ids, pos = session.inputs(i)
            synchronize(session.device)
            dist.barrier(group=group)
            start = time.perf_counter()
            with record_function("superkernel_decode_step"):
                step(ids, pos)
                synchronize(session.device)
            wall += time.perf_counter() - start
    session.restore_cache()
    # Only collectives inside a timed step count: the barrier before each step is profiled too, but its
    # wait is not in ``wall`` (counting it made the share exceed 1 on a loaded machine).
    steps_on = [(e.thread, e.time_range.start, e.time_range.end) for e in prof.events()
                if e.name == "superkernel_decode_step"]
    events = {}
    for e in prof.events():
        name = e.name
        if name == "superkernel_decode_step" or not any(m in name.lower() for m in COLLECTIVE_MARKERS):
            continue
        if not any(t == e.thread and lo <= e.time_range.start <= hi for t, lo, hi in steps_on):
            continue
        events[name] = events.get(name, 0.0) + e.self_cpu_time_total / 1e6
    spent = sum(events.values())
    return {"share": spent / wall if wall else None, "collective_ms_per_step": spent * 1e3 / max(1, steps),
            "step_ms": wall * 1e3 / max(1, steps), "events": {k: round(v * 1e3 / max(1, steps), 4)
                                                             for k, v in sorted(events.items())}}
