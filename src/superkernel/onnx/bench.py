"""ONNX Runtime CPU latency of the original and the fused model, measured in one run."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import onnxruntime as ort

from .verify import session, time_interleaved

CONFIGS = (
    ("original", "ORT_DISABLE_ALL"),
    ("original", "ORT_ENABLE_ALL"),
    ("fused", "ORT_ENABLE_ALL"),
)


@dataclass
class Timing:
    model: str
    level: str
    median_ms: float
    p90_ms: float
    runs: int


@dataclass
class BenchResult:
    timings: list[Timing] = field(default_factory=list)
    warmup: int = 0
    repeat: int = 0
    threads: int = 0

    def get(self, model: str, level: str) -> Timing:
        return next(t for t in self.timings if t.model == model and t.level == level)

    @property
    def speedup_vs_ort_all(self) -> float:
        """original(ORT_ENABLE_ALL) / fused(ORT_ENABLE_ALL); > 1 means the fused model is faster."""
        return self.get("original", "ORT_ENABLE_ALL").median_ms / self.get("fused", "ORT_ENABLE_ALL").median_ms

    @property
    def speedup_vs_unoptimized(self) -> float:
        return self.get("original", "ORT_DISABLE_ALL").median_ms / self.get("fused", "ORT_ENABLE_ALL").median_ms

    def to_dict(self) -> dict:
        return {"warmup": self.warmup, "repeat": self.repeat, "threads": self.threads,
                "timings": [asdict(t) for t in self.timings],
                "speedup_vs_ort_enable_all": self.speedup_vs_ort_all,
                "speedup_vs_ort_disable_all": self.speedup_vs_unoptimized}


def benchmark(original: str | bytes, fused: str | bytes, feeds: dict, *, warmup: int = 10, repeat: int = 100,
              threads: int = 0) -> BenchResult:
    """Median and p90 latency per configuration. Runs are interleaved (one run of each
    session per round, the order rotating) so that drift in machine load affects all three alike."""
    models = {"original": original, "fused": fused}
    sessions = [(m, lvl, session(models[m], getattr(ort.GraphOptimizationLevel, lvl), threads))
                for m, lvl in CONFIGS]
    seconds = time_interleaved([(s, feeds) for _m, _l, s in sessions], repeat, warmup)
    samples = [[t * 1e3 for t in xs] for xs in seconds]
    res = BenchResult(warmup=warmup, repeat=repeat, threads=threads)
    for (m, lvl, _s), xs in zip(sessions, samples):
        xs.sort()
        p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
        res.timings.append(Timing(m, lvl, statistics.median(xs), p90, len(xs)))
    return res
