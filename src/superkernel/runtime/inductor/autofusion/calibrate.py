"""Calibration: a candidate is timed on this machine at its real shapes before it is applied.

For a horizontal GEMM candidate: the unfused side is the separate linears, the fused side one
linear on the pre-concatenated weight (a constant, as with frozen weights) and its split, each as
Inductor's freezing runs a float32 linear (MKL's packed GEMM, :func:`frozen_linear`) — not
Inductor's C++ GEMM templates, which it may pick instead: the end-to-end benchmark
(benchmarks/autofusion_torch.py) is what checks the compiled segment. The two sides alternate
round by round (CPU time with one torch thread, see :func:`clock`); the result is the median of each and the median and upper quartile of the paired
ratio fused/unfused. Results are cached per (rule, shapes, dtype, bias, CPU, torch version, threads)
(:mod:`superkernel.runtime.inductor.autofusion.store`), so identical layers are measured once.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any, Callable

import torch

from superkernel.timing import interleaved_seconds, paired_ratios

ROUNDS = 21
CALLS = 20
#: applied only when the median paired ratio fused/unfused is at most this, and its upper quartile < 1
RATIO_TO_APPLY = 0.97


#: bumped when how a candidate is timed changes (5: real tensors inside a compile; MKL packed GEMMs; thread CPU time;
#: 6: by default both sides compiled by Inductor, :mod:`superkernel.runtime.inductor.autofusion.compiled_timing`)
VERSION = 6


def key(rule: str, m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool, env: str) -> str:
    text = f"{rule}|m={m}|k={k}|n={','.join(map(str, ns))}|{dtype}|bias={bias}|{env}|v{VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def clock() -> tuple[Callable[[], float], str]:
    """With one torch thread, the calling thread's CPU time (the GEMMs run on it): on a shared machine,
    wall time of a few µs-long calls is dominated by waiting for a core (measured here: milliseconds per
    tiny GEMM at load 10 on 2 cores); CPU time is not. Not the process's CPU time: after an Inductor
    compile, other threads of the process keep running (measured: 514 µs of process CPU time per 1x8x8
    GEMM, 1.6 µs of thread time). With more torch threads, wall time (the work is on other threads)."""
    if torch.get_num_threads() == 1:
        return time.thread_time, "thread cpu time"
    return time.perf_counter, "wall time"


def frozen_linear(w: torch.Tensor, b: torch.Tensor | None, m: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ w.T + b`` as Inductor's freezing passes run a float32 linear on CPU: MKL's packed GEMM
    (``mkl._reorder_linear_weight`` once, ``mkl._mkl_linear`` per call); ``F.linear`` where that is absent."""
    if w.dtype == torch.float32 and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, w, b, m)
    return lambda x: torch.nn.functional.linear(x, w, b)


def time_horizontal(m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool,
                    rounds: int = ROUNDS, calls: int = CALLS) -> dict[str, Any]:
    """Interleaved medians (µs) of the separate GEMMs and the one concatenated GEMM, random data.

    Real tensors even when called inside a compile (the planner runs under AOTAutograd's fake mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _time_horizontal(m, k, ns, dtype, bias, rounds, calls)


def _time_horizontal(m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool, rounds: int,
                     calls: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    ws = [(torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype) for n in ns]
    bs = [torch.randn(n, generator=gen).to(dtype) if bias else None for n in ns]
    wcat = torch.cat(ws, 0)
    bcat = torch.cat(bs, 0) if bias else None
    separate = [frozen_linear(w, b, m) for w, b in zip(ws, bs)]
    one = frozen_linear(wcat, bcat, m)

    def unfused() -> Any:
        return [f(x) for f in separate]

    def fused() -> Any:
        return one(x).split(ns, dim=1)

    now, clock_name = clock()
    with torch.no_grad():
        out = paired(unfused, fused, now, rounds, calls)
    return {**out, "clock": clock_name}


def paired(unfused: Callable[[], Any], fused: Callable[[], Any], now: Callable[[], float], rounds: int,
           calls: int) -> dict[str, Any]:
    """The two sides timed in alternating rounds after three throw-away calls each
    (:func:`superkernel.timing.interleaved_seconds`): medians (µs), the median and upper quartile of the paired ratio."""
    seconds = interleaved_seconds([unfused, fused], rounds, warmup=3, calls=calls, clock=now)
    u_s, f_s = ([t * 1e6 for t in xs] for xs in seconds)
    ratios = paired_ratios(u_s, f_s)
    q = statistics.quantiles(ratios, n=4)
    return {"unfused_us": statistics.median(u_s), "fused_us": statistics.median(f_s),
            "ratio": statistics.median(ratios), "ratio_q3": q[2], "rounds": rounds}


def faster(measured: dict[str, Any]) -> bool:
    """Faster beyond noise (see ``RATIO_TO_APPLY``)."""
    return measured["ratio"] <= RATIO_TO_APPLY and measured.get("ratio_q3", measured["ratio"]) < 1.0
