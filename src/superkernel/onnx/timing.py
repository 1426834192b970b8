"""Trustworthy ONNX Runtime timing on a shared machine: warmed process, randomized session
order, interleaved rounds, paired ratios with a distribution-free confidence interval.

Why each part is there:

- **Throw-away session.** The first session ONNX Runtime creates in a process runs slower
  for a while (5-15 % on a small decode step: thread pool, allocator and page-fault
  warm-up land on it). Before any timed session exists, a session of the first model is
  created, run a few times and dropped (:func:`warm_process`), so no timed session is
  "the first".
- **Counterbalanced / randomized creation order.** Creation order may still matter after the
  warm-up (benchmarks/onnx_session_order.py on a 2-core machine at load 16-30: the model whose
  session was created first measured 2-7 % slower in every way tried, within or near the
  noise of one process). A pair of models is therefore timed with two sessions each created
  ABBA or BAAB (:class:`PairSampler`: the end-to-end check and calibration), which cancels a
  steady drift with creation position (not a first-session-only effect); harnesses with more
  models create them in a seeded random order (reported), which turns a bias into noise
  across cases.
- **Fresh sessions per look (big models).** At real width a decode step streams ~1 GB of
  weights per run, and a session keeps its speed for its whole life: four sessions of the
  *same* Qwen2-wide decode model in one process ran 52-61 ms, reproducibly over 60 rounds
  (benchmarks/results/onnx_real_width_decode.md). Rounds cannot average that away; only more
  sessions can. :func:`time_looks` therefore times several *looks*, each with a fresh set of
  sessions created in its own random order, and :func:`looks_estimate` treats the look (not
  the round) as the unit: the median of the per-look median ratios, with the sign-test
  interval over looks.
- **Interleaved, paired rounds.** Every round runs each session once (the order rotated
  per round); the statistic is the median of per-round ratios, so load drift between
  rounds cancels. Its spread is a 95 % confidence interval for that median from order
  statistics (sign-test interval: no normality assumed, robust to the outliers a shared
  machine produces).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from superkernel.timing import interleaved_seconds, paired_ratios

CONFIDENCE = 0.95
THROWAWAY_RUNS = 3


@dataclass
class RatioEstimate:
    """Median of per-round ratios b/a with its confidence interval ``[lo, hi]``."""
    ratio: float
    lo: float
    hi: float
    rounds: int
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict:
        return asdict(self)


def session(model: str | bytes, level, threads: int = 0, log_severity: int = 3):
    """An ONNX Runtime CPU session at ``level`` (``threads``: intra-op threads, 0 = ORT's default;
    ``log_severity``: 3 logs errors, 4 only fatal ones, for a caller that reports the failure itself)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = log_severity
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def median_ci(xs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, lo, hi): the order-statistics (sign-test) interval for the median, whose
    coverage is at least ``confidence`` for any continuous distribution. With too few
    samples for that coverage the interval is the whole range."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median_ci: no samples")
    med = statistics.median(s)
    alpha = 1.0 - confidence
    # largest k with P(Binomial(n, 1/2) <= k - 1) <= alpha / 2: the interval is [s[k-1], s[n-k]]
    k, cdf = 0, 0.0
    while k < n:
        cdf_next = cdf + math.comb(n, k) / 2.0 ** n
        if cdf_next > alpha / 2:
            break
        cdf, k = cdf_next, k + 1
    if k == 0:
        return med, s[0], s[-1]
    return med, s[k - 1], s[n - k]


def ratio_estimate(pairs: Sequence[tuple[float, float]], confidence: float = CONFIDENCE) -> RatioEstimate:
    """Per-round ratios b/a of ``(a, b)`` time pairs -> median with its interval."""
    ratios = paired_ratios([a for a, _ in pairs], [b for _, b in pairs])
    med, lo, hi = median_ci(ratios, confidence)
    return RatioEstimate(med, lo, hi, len(ratios), confidence)


def spread(xs: Sequence[float]) -> dict:
    """Median, quartiles and min of one configuration's samples (for reporting)."""
    s = sorted(xs)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2], "min": s[0], "n": len(s)}


def creation_order(n: int, seed: int | None) -> list[int]:
    """The order in which ``n`` sessions are created: a seeded random permutation."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def warm_process(make_session: Callable[[], object], feeds: dict | Callable | None,
                 runs: int = THROWAWAY_RUNS) -> None:
    """Create a throw-away session, run it ``runs`` times (when ``feeds`` are given, or a
    function making them from the session), drop it."""
    s = make_session()
    if callable(feeds):
        feeds = feeds(s)
    if feeds is not None:
        for _ in range(runs):
            s.run(None, feeds)
    del s


def open_sessions(make: Sequence[Callable[[], object]], seed: int | None,
                  warm_feeds: dict | Callable | None = None) -> tuple[list, list[int]]:
    """Warm the process with a throw-away session of ``make[0]``, then create every session
    in a seeded random order. Returns (sessions in the order of ``make``, creation order)."""
    warm_process(make[0], warm_feeds)
    return create_in_order(make, seed)


def create_in_order(make: Sequence[Callable[[], object]], seed: int | None) -> tuple[list, list[int]]:
    """Create one session per ``make`` in a seeded random order (:func:`creation_order`)."""
    order = creation_order(len(make), seed)
    sessions: list = [None] * len(make)
    for i in order:
        sessions[i] = make[i]()
    return sessions, order


def time_interleaved(runs: Sequence[tuple[object, dict]], rounds: int, warmup: int = 0, *,
                     clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds of each ``(session, feeds)`` run per round, after ``warmup`` untimed rounds
    (:func:`superkernel.timing.interleaved_seconds`: the order rotated by one each round, so
    that drift in machine load affects all alike). ``clock``: seconds (a test passes a synthetic one)."""
    return interleaved_seconds([functools.partial(s.run, None, feeds) for s, feeds in runs], rounds, warmup=warmup,
                               clock=clock)


def balanced_order(seed: int | None) -> list[int]:
    """Creation order of four sessions, two of each of two models: ABBA or BAAB (seeded).
    Each model then has one session created early and one late, so an effect of the
    creation position that grows or shrinks steadily cancels in the pair."""
    return [0, 1, 1, 0] if random.Random(seed).random() < 0.5 else [1, 0, 0, 1]


class PairSampler:
    """Two models in ONNX Runtime (warmed process); ``sample(n)`` times ``n`` more interleaved
    rounds and returns ``(a_ms, b_ms)`` per round. Sessions are kept, so an adaptive
    comparison can ask for more rounds without re-creating them.

    ``balanced`` (default): two sessions per model created ABBA or BAAB, a round runs all four
    and a model's time is the mean of its two (see the module docstring and
    benchmarks/results/onnx_session_order.md). Otherwise one session each, random order."""

    def __init__(self, a, b, feeds: dict, *, threads: int = 1, warmup: int = 5, seed: int | None = None,
                 feeds_b: dict | None = None, balanced: bool = True, clock: Callable[[], float] = time.perf_counter):
        import onnxruntime as ort

        self.clock = clock
        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        fb = feeds if feeds_b is None else feeds_b
        make = [lambda: session(a, level, threads), lambda: session(b, level, threads)]
        if balanced:
            warm_process(make[0], feeds)
            self.order = balanced_order(seed)
            self.runs = [(make[m](), feeds if m == 0 else fb) for m in self.order]
            self.model_of = list(self.order)
        else:
            (sa, sb), self.order = open_sessions(make, seed, warm_feeds=feeds)
            self.runs, self.model_of = [(sa, feeds), (sb, fb)], [0, 1]
        self._warmup = warmup
        self.seconds = 0.0

    def sample(self, rounds: int) -> list[tuple[float, float]]:
        t0 = self.clock()
        xs = time_interleaved(self.runs, rounds, self._warmup, clock=self.clock)
        self._warmup = 0
        self.seconds += self.clock() - t0
        out = []
        for r in range(rounds):
            per = ([], [])
            for i, m in enumerate(self.model_of):
                per[m].append(xs[i][r])
            out.append((statistics.fmean(per[0]) * 1e3, statistics.fmean(per[1]) * 1e3))
        return out


@dataclass
class Decision:
    """Outcome of an adaptive paired comparison of b against a at ``threshold`` (b/a)."""
    verdict: str  # "slower" (b/a > threshold, confident) | "not slower" (<= threshold, confident) | "unresolved"
    estimate: RatioEstimate
    a_ms: float
    b_ms: float
    threshold: float
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, **self.estimate.to_dict(), "a_ms": self.a_ms, "b_ms": self.b_ms,
                "threshold": self.threshold, "seconds": self.seconds}


def decide(sampler, threshold: float, *, rounds: int = 40, max_rounds: int = 320, max_seconds: float = 60.0,
           confidence: float = CONFIDENCE) -> Decision:
    """Time ``rounds`` rounds; while the confidence interval of the median ratio b/a still
    contains ``threshold``, double the rounds (up to ``max_rounds`` or ``max_seconds``).
    Close calls get more rounds; clear ones stop at ``rounds``."""
    t0 = time.perf_counter()
    pairs = list(sampler.sample(rounds))
    while True:
        est = ratio_estimate(pairs, confidence)
        if est.lo > threshold or est.hi <= threshold:
            break
        if len(pairs) >= max_rounds or time.perf_counter() - t0 >= max_seconds:
            break
        pairs += sampler.sample(min(len(pairs), max_rounds - len(pairs)))
    verdict = "slower" if est.lo > threshold else "not slower" if est.hi <= threshold else "unresolved"
    return Decision(verdict, est, statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
                    threshold, time.perf_counter() - t0)


def across_looks(looks: Sequence[Decision]) -> RatioEstimate:
    """One estimate over several looks at the same comparison, each in its own sessions.

    When looks disagree, the sessions differ by more than the rounds' noise says, so the look
    (not the round) is the unit: the ratio is the median of the looks' ratios and the interval
    the envelope of theirs. Pooling the rounds instead would let the look that happened to
    run the most rounds (the closest call) decide."""
    est = [d.estimate for d in looks]
    return RatioEstimate(statistics.median(e.ratio for e in est), min(e.lo for e in est), max(e.hi for e in est),
                         sum(e.rounds for e in est), min(e.confidence for e in est))


def time_looks(make: Sequence[Callable[[], object]], feeds: dict, *, looks: int, rounds: int, warmup: int = 2,
               seed: int | None = None, max_seconds: float | None = None, min_looks: int = 3,
               clock: Callable[[], float] = time.perf_counter) -> list[list[list[float]]]:
    """Seconds per round of every model, look by look: ``result[look][model]`` is that look's
    list of per-round times. Each look warms the process with a throw-away session of
    ``make[0]`` (first look only), creates one fresh session per model in a seeded random
    order (another order every look), times ``rounds`` interleaved rounds after ``warmup``,
    and drops the sessions before the next look, so every look draws new sessions (see the
    module docstring: at real width a session's speed is a draw that lasts its lifetime).
    With ``max_seconds``, stops after the look that passes it (at least ``min_looks``).
    ``clock``: seconds (a test passes a synthetic one)."""
    t0 = clock()
    out: list[list[list[float]]] = []
    base = 0 if seed is None else seed
    for k in range(looks):
        if k == 0:
            warm_process(make[0], feeds)
        sessions, _order = create_in_order(make, base + 7919 * k)
        out.append(time_interleaved([(s, feeds) for s in sessions], rounds, warmup, clock=clock))
        del sessions
        if max_seconds is not None and k + 1 >= min_looks and clock() - t0 > max_seconds:
            break
    return out


def looks_estimate(per_look: Sequence[Sequence[Sequence[float]]], a: int, b: int,
                   confidence: float = CONFIDENCE) -> RatioEstimate:
    """b/a over looks from :func:`time_looks`: each look's statistic is its median per-round
    ratio; the estimate is the median over looks with the sign-test interval over looks (with
    up to 8 looks that interval is the whole range of the looks). ``rounds`` counts all
    rounds of all looks."""
    ratios = [ratio_estimate(list(zip(look[a], look[b])), confidence).ratio for look in per_look]
    med, lo, hi = median_ci(ratios, confidence)
    return RatioEstimate(med, lo, hi, sum(len(look[a]) for look in per_look), confidence)


HUGE_PAGES_HINT = ("GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc >= 2.35) puts ONNX Runtime's buffers on transparent "
                   "huge pages: sessions of a ~1 GB model then run alike (and faster)")


def anon_huge_pages_kb() -> int | None:
    """This process's anonymous memory on transparent huge pages in kB (None where the kernel
    does not say: not Linux). 0 with a large model loaded means its weights sit on 4 KiB pages,
    where a session's speed depends on where they landed (see the module docstring)."""
    from ..hugepages import memory

    got = memory()
    return got["anon_huge_kb"] if got else None
