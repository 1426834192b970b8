"""End-to-end check: a fusion that makes the whole model slower is not kept.

Micro-benchmarks measure each fusion alone; in the whole model a fused op can still cost
more (it blocks one of ONNX Runtime's own fusions, it changes the memory layout the next
op sees). After fusing, the original and the fused model are timed in ONNX Runtime with
``ORT_ENABLE_ALL``, interleaved, in this run. While the fused model is slower than the
original (beyond ``TOLERANCE``), each applied fusion kind (rule) is left out in turn, the
model is fused again without it, and the leave-one-out model that is fastest is kept;
this repeats until the fused model is not slower or no fusion is left.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

TOLERANCE = 0.01   # fused may be at most 1 % slower than the original before kinds are dropped
WARMUP = 5
ROUNDS = 40


def time_pair(original: str, fused: str, feeds: dict, *, threads: int = 1, rounds: int = ROUNDS,
              warmup: int = WARMUP) -> tuple[float, float]:
    """Median ms of the original and the fused model (ORT_ENABLE_ALL, interleaved)."""
    import onnxruntime as ort

    from .verify import session

    ss = [session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads) for p in (original, fused)]
    for _ in range(warmup):
        for s in ss:
            s.run(None, feeds)
    xs: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, s in enumerate(ss):
            t0 = time.perf_counter()
            s.run(None, feeds)
            xs[i].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(xs[0]), statistics.median(xs[1])


def guard(original: str, fusion, staged, refuse: Callable, *, dims: Mapping[str, int], seed: int = 0,
          threads: int = 1, timer: Callable | None = None):
    """Return (fusion, staged, record). ``refuse(excluded_rules)`` fuses the input again
    without those rules and stages it; ``timer(original, fused, feeds)`` is the timing seam."""
    from . import verify as V

    timer = timer or (lambda a, b, f: time_pair(a, b, f, threads=threads))
    s0 = V.session(original, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, dims, V.VERIFY_DEFAULT_DIM, seed)
    t_orig, t_fused = timer(original, staged.model_path, feeds)
    steps = [{"excluded": [], "original_ms": t_orig, "fused_ms": t_fused, "ratio": t_fused / t_orig}]
    excluded: set[str] = set()
    while t_fused > t_orig * (1 + TOLERANCE) and fusion.applied:
        kinds = sorted({c.rule for c in fusion.applied})
        best = None
        for k in kinds:
            f2, s2 = refuse(excluded | {k})
            o2, x2 = timer(original, s2.model_path, feeds)
            steps.append({"excluded": sorted(excluded | {k}), "original_ms": o2, "fused_ms": x2, "ratio": x2 / o2,
                          "tried": True})
            if best is None or x2 / o2 < best[0]:
                if best is not None:
                    best[3].discard()
                best = (x2 / o2, k, f2, s2, o2, x2)
            else:
                s2.discard()
        ratio, k, f2, s2, o2, x2 = best
        staged.discard()
        excluded.add(k)
        fusion, staged, t_orig, t_fused = f2, s2, o2, x2
        steps.append({"excluded": sorted(excluded), "original_ms": o2, "fused_ms": x2, "ratio": ratio,
                      "chosen": True})
    record = {"tolerance": TOLERANCE, "original_ms": t_orig, "fused_ms": t_fused, "ratio": t_fused / t_orig,
              "dropped_rules": sorted(excluded), "steps": steps, "threads": threads}
    return fusion, staged, record
