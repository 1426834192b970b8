"""End-to-end check: a fusion that makes the whole model slower is not kept.

Micro-benchmarks measure each fusion alone; in the whole model a fused op can still cost
more (it blocks one of ONNX Runtime's own fusions, it changes the memory layout the next
op sees). After fusing, the original and the fused model are timed in ONNX Runtime with
``ORT_ENABLE_ALL``, interleaved, in this run; the ratio is the median of the per-round
fused/original ratios. While the fused model is slower than the original (beyond
``TOLERANCE``), each applied fusion kind (rule) is left out in turn, the
model is fused again without it, and the leave-one-out model that is fastest is kept;
this repeats until the fused model is not slower or no fusion is left.
"""

from __future__ import annotations

import statistics
from typing import Callable, Mapping

TOLERANCE = 0.01   # fused may be at most 1 % slower than the original before kinds are dropped
WARMUP = 5
ROUNDS = 40


def time_pair(original: str, fused: str, feeds: dict, *, threads: int = 1, rounds: int | None = None,
              warmup: int | None = None) -> tuple[float, float, float]:
    """Median ms of the original and the fused model (ORT_ENABLE_ALL, interleaved) and the
    median of the per-round ratios fused/original (paired, so load changes between rounds
    on a shared machine cancel out). ``rounds`` / ``warmup``: ROUNDS / WARMUP when None."""
    import onnxruntime as ort

    rounds = ROUNDS if rounds is None else rounds
    warmup = WARMUP if warmup is None else warmup

    from .verify import session, time_interleaved

    ss = [session(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads) for p in (original, fused)]
    xs = [[t * 1e3 for t in ts] for ts in time_interleaved([(s, feeds) for s in ss], rounds, warmup)]
    return statistics.median(xs[0]), statistics.median(xs[1]), statistics.median(
        f / o for o, f in zip(xs[0], xs[1]))


def guard(original: str, fusion, staged, refuse: Callable, *, dims: Mapping[str, int], seed: int = 0,
          threads: int = 1, timer: Callable | None = None):
    """Return (fusion, staged, record). ``refuse(excluded_rules)`` fuses the input again
    without those rules and stages it; ``timer(original, fused, feeds)`` is the timing seam."""
    from . import verify as V

    base_timer = timer or (lambda a, b, f: time_pair(a, b, f, threads=threads))

    def measure(path):
        r = base_timer(original, path, feeds)
        return (r[0], r[1], r[2]) if len(r) > 2 else (r[0], r[1], r[1] / r[0])

    s0 = V.session(original, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, dims, V.VERIFY_DEFAULT_DIM, seed)
    t_orig, t_fused, ratio = measure(staged.model_path)
    steps = [{"excluded": [], "original_ms": t_orig, "fused_ms": t_fused, "ratio": ratio}]
    excluded: set[str] = set()
    while ratio > 1 + TOLERANCE and fusion.applied:
        kinds = sorted({c.rule for c in fusion.applied})
        best = None
        for k in kinds:
            f2, s2 = refuse(excluded | {k})
            o2, x2, r2 = measure(s2.model_path)
            steps.append({"excluded": sorted(excluded | {k}), "original_ms": o2, "fused_ms": x2, "ratio": r2,
                          "tried": True})
            if best is None or r2 < best[0]:
                if best is not None:
                    best[3].discard()
                best = (r2, k, f2, s2, o2, x2)
            else:
                s2.discard()
        ratio, k, f2, s2, o2, x2 = best
        staged.discard()
        excluded.add(k)
        fusion, staged, t_orig, t_fused = f2, s2, o2, x2
        steps.append({"excluded": sorted(excluded), "original_ms": o2, "fused_ms": x2, "ratio": ratio,
                      "chosen": True})
    record = {"tolerance": TOLERANCE, "original_ms": t_orig, "fused_ms": t_fused, "ratio": ratio,
              "ratio_is": "median of per-round fused/original ratios", "dropped_rules": sorted(excluded),
              "steps": steps, "threads": threads}
    return fusion, staged, record
