"""End-to-end check: a fusion that makes the whole model slower is not kept.

Micro-benchmarks measure each fusion alone; in the whole model a fused op can still cost
more (it blocks one of ONNX Runtime's own fusions, it changes the memory layout the next
op sees). After fusing, the original and the fused model are timed in ONNX Runtime with
``ORT_ENABLE_ALL`` (:class:`superkernel.onnx.timing.PairSampler`: warmed process, two
sessions per model created ABBA/BAAB, interleaved rounds) and decided with a paired test: the 95 % confidence interval of the
median per-round ratio fused/original. Rounds adapt: a clear result stops at ``ROUNDS``;
while the interval still contains the threshold ``1 + TOLERANCE`` they double, up to
``MAX_ROUNDS`` / ``MAX_SECONDS``.

Only a *confident* "slower" triggers work, and it is confirmed by a second measurement in
fresh sessions first (one noisy run never drops a fusion). When the two looks disagree (on a
loaded machine a pair of sessions can run a few percent apart for its whole life), a third
look decides by majority, and the record publishes the median of the three looks' ratios
with the envelope of their intervals (``looks_disagreed``), not the last look's
confident-looking interval. Then each applied fusion kind
(rule) is left out in turn and the model is fused again without it; the best leave-one-out
model is compared head to head with the current fused model, and the kind is dropped only
when that comparison confirms it is faster (an implausible gain from dropping an unrelated
kind is re-measured away, not acted on). This repeats until the fused model is not
confidently slower, no leave-one-out gain is confirmed, or no fusion is left.

A model of 256 MiB or more is timed in a child process on transparent huge pages when this
process is not (:mod:`superkernel.onnx.hugepages`): on 4 KiB pages each session of a ~1 GB
decode step keeps a speed of its own, by more than the 1 % this check resolves.
"""

from __future__ import annotations

from typing import Callable, Mapping

from . import timing as T

TOLERANCE = 0.01   # fused may be at most 1 % slower than the original before kinds are dropped
WARMUP = 5
ROUNDS = 40        # first look; doubled while the interval contains the threshold
MAX_ROUNDS = 320
MAX_SECONDS = 60.0  # per comparison


def ort_sampler(threads: int = 1) -> Callable:
    """The real timing: ``sampler(a, b, feeds, seed)`` -> :class:`timing.PairSampler`, in a child
    process on transparent huge pages when the models are large and this process is not
    (:mod:`superkernel.onnx.hugepages`: on 4 KiB pages a ~1 GB model's sessions differ by more
    than a fusion changes it)."""
    from .hugepages import pair_sampler

    return pair_sampler(threads, WARMUP)


def _decide(sampler, threshold: float) -> T.Decision:
    return T.decide(sampler, threshold, rounds=ROUNDS, max_rounds=MAX_ROUNDS, max_seconds=MAX_SECONDS)


def guard(original: str, fusion, staged, refuse: Callable, *, dims: Mapping[str, int], seed: int = 0,
          threads: int = 1, sampler: Callable | None = None):
    """Return (fusion, staged, record). ``refuse(excluded_rules)`` fuses the input again
    without those rules and stages it; ``sampler(a, b, feeds, seed)`` returns an object whose
    ``sample(n)`` gives ``n`` rounds of (a_ms, b_ms) (the timing seam; default: ONNX Runtime)."""
    from . import verify as V

    make = sampler or ort_sampler(threads)
    s0 = V.session(original, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feeds = V.make_inputs(s0, dims, V.VERIFY_DEFAULT_DIM, seed)
    del s0
    draws = iter(range(seed * 1000, seed * 1000 + 10**6))  # session-order seeds, reproducible per run
    threshold = 1 + TOLERANCE

    children: list[dict] = []  # what the huge-page timing processes saw, when they were used

    def timed(a: str, b: str):
        s = make(a, b, feeds, next(draws))
        if isinstance(getattr(s, "child", None), dict):
            children.append(s.child)
        return s

    def vs_original(path: str) -> T.Decision:
        return _decide(timed(original, path), threshold)

    steps: list[dict] = []

    def step(d: T.Decision, **kw) -> None:
        steps.append({**kw, "original_ms": d.a_ms, "fused_ms": d.b_ms, **d.estimate.to_dict(),
                      "verdict": d.verdict, "seconds": d.seconds})

    cur = vs_original(staged.model_path)
    step(cur, excluded=[])
    looks = [cur]
    if cur.verdict == "slower":  # confirm in fresh sessions before acting on it
        cur = vs_original(staged.model_path)
        step(cur, excluded=[], confirm=True)
        looks.append(cur)
        if cur.verdict != "slower":  # the two looks disagree: a third one decides
            cur = vs_original(staged.model_path)
            step(cur, excluded=[], tiebreak=True)
            looks.append(cur)
    excluded: set[str] = set()
    stop = ""
    while cur.verdict == "slower" and fusion.applied:
        best = None
        for k in sorted({c.rule for c in fusion.applied}):
            f2, s2 = refuse(excluded | {k})
            d2 = vs_original(s2.model_path)
            step(d2, excluded=sorted(excluded | {k}), tried=True)
            if best is None or d2.estimate.ratio < best[0].estimate.ratio:
                if best is not None:
                    best[3].discard()
                best = (d2, k, f2, s2)
            else:
                s2.discard()
        d2, k, f2, s2 = best
        # head to head: is the model without k really faster than the current one?
        h2h = _decide(timed(staged.model_path, s2.model_path), 1.0)
        steps.append({"head_to_head": sorted(excluded | {k}), **h2h.to_dict()})
        if h2h.estimate.hi >= 1.0:
            s2.discard()
            stop = (f"leaving out {k} measured {d2.estimate.ratio:.3f} against the original, but head to head "
                    f"with the current fused model it was not confirmed faster (ratio {h2h.estimate.ratio:.3f}, "
                    f"{int(h2h.estimate.confidence * 100)} % interval {h2h.estimate.lo:.3f}-{h2h.estimate.hi:.3f}); "
                    "nothing more dropped")
            break
        staged.discard()
        excluded.add(k)
        fusion, staged, cur = f2, s2, d2
        steps.append({"excluded": sorted(excluded), "chosen": True, **cur.to_dict()})
    est = cur.estimate
    record = {"tolerance": TOLERANCE, "original_ms": cur.a_ms, "fused_ms": cur.b_ms, "ratio": est.ratio,
              "ratio_lo": est.lo, "ratio_hi": est.hi, "confidence": est.confidence, "rounds": est.rounds,
              "verdict": cur.verdict,
              "ratio_is": "median of per-round fused/original ratios (paired, interleaved, warmed, two sessions "
                          "per model created ABBA/BAAB), with its sign-test confidence interval",
              "dropped_rules": sorted(excluded), "steps": steps, "threads": threads}
    if stop:
        record["stopped"] = stop
    huge = children[-1].get("anon_huge_pages_kb") if children else T.anon_huge_pages_kb()
    record["timed_in"] = "a child process with GLIBC_TUNABLES=" + children[-1].get("glibc_tunables", "") \
        if children else "this process"
    if huge is not None:
        record["anon_huge_pages_kb"] = huge
    if len(looks) == 3 and huge == 0:
        record["note"] = ("looks in fresh sessions disagreed while the weights sat on 4 KiB pages: a session's speed "
                          "then depends on where its weights landed, by more than a fusion changes it; "
                          + T.HUGE_PAGES_HINT)
    if len(looks) == 3 and not excluded:
        # Looks in fresh sessions disagreed: no single look's interval is the spread to publish.
        est = T.across_looks(looks)
        votes = [d.verdict for d in looks]
        majority = max(set(votes), key=votes.count) if max(map(votes.count, votes)) >= 2 else "unresolved"
        record.update(ratio=est.ratio, ratio_lo=est.lo, ratio_hi=est.hi, rounds=est.rounds,
                      verdict=majority,
                      looks_disagreed=True,
                      ratio_is="three looks in fresh sessions disagreed: median of their ratios (each the median "
                               "of per-round fused/original ratios) and the envelope of their sign-test "
                               "intervals; the majority verdict decides")
    return fusion, staged, record
