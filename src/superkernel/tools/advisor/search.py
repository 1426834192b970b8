"""Which plans ``optimize`` measures (``--search``): the best predicted first (``predicted``, auto's default) or
all of them (``all``: then the showdown; ``exhaustive``: each timed once in its own run).

The predicted search (docs/workflow.md, "How auto chooses"): plans are tried in order of predicted
gain (:mod:`~superkernel.tools.advisor.predict`), plans that cover too little or whose
trial capture failed are skipped, and the search stops when no remaining plan is predicted
to beat the best measured one by more than the noise threshold. Each mode's first plan is
always measured, since its efficiency is only known once a plan of it ran.

One timed run of a plan decides nothing on a loaded machine (a decode step of ~1 ms read 18x
off once). With a ``timer`` (:class:`~superkernel.tools.advisor.retime.Interleaved`), every
measured plan stays compiled and is timed again in rounds interleaved with plain
torch.compile (and the best plan so far): its step is the median over rounds of
(plan / plain torch.compile) x plain torch.compile's median step over all rounds. A result implausible against its
prediction, its own run, or whose rounds disagree, is timed again (more rounds) before it
decides anything; the candidates still kept (within :data:`RELEASE_MARGIN` of the best) are timed
once more together with eager and plain torch.compile at the end, and those rounds give the steps the
recommendation compares. Re-timing costs a few decode runs; a compile costs seconds to minutes.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Protocol

import torch

from superkernel.timing import paired_ratios
from superkernel.tools.advisor.predict import CHEAP_COMPILE, Forecast, efficiency, next_decision, predict_ms
from superkernel.tools.advisor.results import NOISE_FLOOR, RunResult, recommendable
from superkernel.tools.advisor.strategies import ScopePlan

RunPlan = Callable[[ScopePlan, tuple[str, ...]], list[RunResult]]
#: The key of plain torch.compile's times in :meth:`Timer.retime`'s answer.
BASELINE = "torch.compile"
#: The name of the eager (uncompiled) step, timed in the final showdown.
EAGER = "eager"
#: Interleaved rounds after each measured plan; a re-measurement takes twice as many.
ROUNDS = 3
#: Rounds of the final showdown among the kept candidates (within :data:`RELEASE_MARGIN` of the best):
#: up to SHOWDOWN_ROUNDS, fewer (not under MIN_SHOWDOWN_ROUNDS) when its first round says they would take
#: more than SHOWDOWN_BUDGET_S (a real-width model: ~15 s a round of three 36-step decodes).
SHOWDOWN_ROUNDS, MIN_SHOWDOWN_ROUNDS, SHOWDOWN_BUDGET_S = 5, 3, 45.0
#: A re-timed step this many times off its prediction or its own run is timed again before it counts.
IMPLAUSIBLE = 2.0
#: Rounds whose slowest / fastest (plan / baseline) ratio exceeds this disagree: timed again.
SPREAD = 1.25
#: Candidates slower than the best by more than this are released (their compiled steps freed).
RELEASE_MARGIN = 0.15


class Timer(Protocol):
    """Times kept candidates (by result name) interleaved with plain torch.compile."""

    def retime(self, names: list[str], rounds: int) -> dict[str, list[float]]:
        """Per name and for :data:`BASELINE`: one step time (ms) per round, the order rotating each round."""

    def release(self, name: str) -> None:
        """Forget a candidate (its compiled step and model copy)."""


def _record(forecasts: list[Forecast], results: list[RunResult]) -> None:
    for r in results:
        f = _forecast(forecasts, r)
        if f is not None:
            f.status = "measured"
            f.measured_ms = r.median_ms if not r.error else None
            f.compile_s = r.compile_s
            f.passed = recommendable(r)
            if r.error:
                f.reason = f"error: {r.error[:200]}"
            elif not r.passed:
                f.reason = "failed precision"
            elif r.recompiles:
                f.reason = "recompiles in steady state"


def _forecast(forecasts: list[Forecast], r: RunResult) -> Forecast | None:
    return next((f for f in forecasts if f.strategy == r.strategy and f.mode == r.mode), None)


def cheap_modes(forecasts: list[Forecast], base_compile_s: float | None) -> set[str]:
    """Modes whose measured plans compiled (median) in at most :data:`CHEAP_COMPILE` x plain torch.compile's
    compile time (none when that is unknown)."""
    if not base_compile_s:
        return set()
    out = set()
    for mode in {f.mode for f in forecasts}:
        times = [f.compile_s for f in forecasts if f.mode == mode and f.status == "measured" and f.compile_s]
        if times and statistics.median(times) <= CHEAP_COMPILE * base_compile_s:
            out.add(mode)
    return out


def run_search(plans: list[ScopePlan], modes: tuple[str, ...], forecasts: list[Forecast], run_plan: RunPlan, *,
               base_ms: float, prior: float, exhaustive: bool, noise: float = NOISE_FLOOR,
               note: Callable[[str], None] = lambda text: None, timer: Timer | None = None,
               base_compile_s: float | None = None,
               baselines: dict[str, RunResult] | None = None,
               last_use: Callable[[list[RunResult]], None] | None = None) -> list[RunResult]:
    """Measure plans through ``run_plan(plan, modes)``; fills each forecast's status, reason and numbers.
    ``base_ms``: the whole step compiled without scopes (:func:`~superkernel.tools.advisor.predict.base_step_ms`);
    ``base_compile_s``: its compile time (what makes a mode's compile cheap, :func:`cheap_modes`);
    ``baselines``: the eager and plain torch.compile results (:data:`EAGER`, :data:`BASELINE`): with a timer,
    their steps become those of the final showdown, so the recommendation compares numbers of the same rounds.
    ``exhaustive``: every plan measured (``--search all`` or ``exhaustive``); with a timer (``all``), then the
    showdown among all that passed. ``last_use(results)``: called once every plan is timed, while the kept
    steps still run (after it they are dropped and Dynamo is reset, which would make a guarded step compile again)."""
    for f in forecasts:
        f.prior_ms = predict_ms(f, base_ms, prior)
    results: list[RunResult] = []
    if exhaustive:
        for f in forecasts:
            f.predicted_ms = f.prior_ms
        for plan in plans:
            out = run_plan(plan, tuple(modes))
            _record(forecasts, out)
            results += out
        if timer is not None:  # a named strategy: every plan kept meets eager and torch.compile in the showdown
            timing = _Timing(timer, base_ms, noise, note)
            for r in results:
                if recommendable(r) and r.step is not None:
                    timing.keep(r)
            timing.final(results, forecasts, baselines or {})
            if last_use is not None:
                last_use(results)
            timing.close(results)
        return results
    by_strategy = {p.strategy: p for p in plans}
    timing = _Timing(timer, base_ms, noise, note)
    while True:
        best = min((r for r in results if recommendable(r)), key=lambda r: r.median_ms, default=None)
        decision = next_decision(forecasts, timing.base(), prior, best.median_ms if best else None,
                                 best.name if best else None, noise, cheap_modes(forecasts, base_compile_s))
        if decision is None:
            break
        f, run = decision
        if not run:
            f.status = "skipped"
            note(f"skipped {f.name}: {f.reason}")
            continue
        calibrated = efficiency(forecasts, f.mode, timing.base()) is not None
        out = run_plan(by_strategy[f.strategy], (f.mode,))
        _record(forecasts, out)
        results += out
        for r in out:
            if recommendable(r):
                timing.settle(r, forecasts, calibrated, best)
        timing.refresh(results, forecasts)
        timing.release_slow()
    timing.final(results, forecasts, baselines or {})
    if last_use is not None:
        last_use(results)
    timing.close(results)
    torch._dynamo.reset()
    return results


class _Timing:
    """The interleaved re-timing of the measured candidates (auto's search, a named strategy's showdown;
    a no-op without a timer).

    A candidate's step = median over its rounds of (candidate / plain torch.compile, same round)
    x :meth:`base`: the median of plain torch.compile's step over every round so far (its own
    run alone can read several times off on a loaded machine)."""

    def __init__(self, timer: Timer | None, base_ms: float, noise: float, note: Callable[[str], None]):
        self.timer, self.base_ms, self.noise, self.note = timer, base_ms, noise, note
        self.samples: dict[str, list[float]] = {}   # per candidate: (plan / baseline) per round
        self.base_rounds: list[float] = []          # plain torch.compile's step, every round
        self.timed: dict[str, int] = {}             # per candidate: rounds timed in all (showdown included)
        self.alive: dict[str, float | None] = {}    # kept candidates: name -> its own run's median step

    def base(self) -> float:
        return statistics.median(self.base_rounds) if self.base_rounds else self.base_ms

    def _rounds(self, names: list[str], rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """(ratios to the baseline per name, raw ms per name and baseline) of ``rounds`` new rounds."""
        raw = self.timer.retime(names, rounds)
        base = raw[BASELINE]
        self.base_rounds += [b for b in base if b > 0]
        got = {n: paired_ratios(base, raw.get(n, [])) for n in names}
        for n, ratios in got.items():
            self.samples.setdefault(n, []).extend(ratios)
            self.timed[n] = self.timed.get(n, 0) + len(ratios)
        return got, raw

    def keep(self, r: RunResult) -> None:
        """``r`` stays compiled as a candidate; its own run's median is kept beside its re-timed step."""
        r.own_median_ms = r.median_ms
        self.alive[r.name] = r.median_ms

    def score(self, name: str) -> float:
        return statistics.median(self.samples[name]) * self.base()

    def settle(self, r: RunResult, forecasts: list[Forecast], calibrated: bool, best: RunResult | None) -> None:
        """Time ``r`` interleaved with the baseline and the best so far; again if implausible."""
        if self.timer is None:
            return
        f = _forecast(forecasts, r)
        r.own_median_ms = r.median_ms
        others = [best.name] if best is not None and best.name in self.alive and best.name != r.name else []
        got, _ = self._rounds([r.name] + others, ROUNDS)
        why = self._implausible(r, f, calibrated, got[r.name])
        if why:
            self.note(f"timing {r.name} again: {why}")
            got, _ = self._rounds([r.name] + others, 2 * ROUNDS)
            if f is not None:
                f.remeasured = why
        if self.samples.get(r.name):
            self.keep(r)
        else:  # never timed (cannot happen with a kept step): it keeps its own run's median
            r.own_median_ms = None

    def _implausible(self, r: RunResult, f: Forecast | None, calibrated: bool, ratios: list[float]) -> str:
        if not ratios:
            return "no round timed"
        step = statistics.median(ratios) * self.base()
        if max(ratios) / min(ratios) > SPREAD:
            return f"its rounds disagree (plan / torch.compile from {min(ratios):.2f} to {max(ratios):.2f})"
        if r.own_median_ms and not 1 / IMPLAUSIBLE <= step / r.own_median_ms <= IMPLAUSIBLE:
            return f"its own run read {r.own_median_ms:.3f} ms, the interleaved rounds {step:.3f} ms"
        if calibrated and f is not None and f.predicted_ms and not 1 / IMPLAUSIBLE <= step / f.predicted_ms <= IMPLAUSIBLE:
            return f"predicted {f.predicted_ms:.3f} ms, the interleaved rounds read {step:.3f} ms"
        return ""

    def refresh(self, results: list[RunResult], forecasts: list[Forecast], base: float | None = None) -> None:
        """Every timed candidate's step from its rounds and the baseline's median (or ``base``)."""
        base = base or self.base()
        for r in results:
            if self.samples.get(r.name) and r.kind == "plan":
                _retimed(r, statistics.median(self.samples[r.name]) * base)
                f = _forecast(forecasts, r)
                if f is not None:
                    f.measured_ms = r.median_ms
                    f.rounds = self.timed[r.name]

    def release_slow(self) -> None:
        """Free the candidates more than :data:`RELEASE_MARGIN` behind the best, by their rounds *and* their own
        run: a few rounds of a sub-millisecond step are a short window that load distorts (gpt_neox: the fastest
        own run, 0.44 ms, read 0.74 ms over its first 3 rounds and was freed before the showdown)."""
        if self.timer is None or not self.alive:
            return
        best = min(self.score(n) for n in self.alive)
        for name, own in list(self.alive.items()):
            if self.score(name) > best * (1 + RELEASE_MARGIN) and (own is None or own > best * (1 + RELEASE_MARGIN)):
                del self.alive[name]
                self.timer.release(name)

    def final(self, results: list[RunResult], forecasts: list[Forecast], baselines: dict[str, RunResult]) -> None:
        """The showdown: every kept candidate, eager and plain torch.compile timed together; the medians of these rounds are the steps every decision after the search compares."""
        if self.timer is None or not self.alive:
            return
        # every kept candidate (within RELEASE_MARGIN of the best): under load the ratio of one plan to the
        # baseline moved by 10% between rounds, so a narrower showdown let an older score beat the fresh ones
        contenders = list(self.alive)
        names = contenders + ([EAGER] if EAGER in baselines else [])
        for n in contenders:  # the showdown's own rounds decide between them
            self.samples[n] = []
        start = time.perf_counter()
        _, raw = self._rounds(names, 1)
        more = showdown_rounds(time.perf_counter() - start) - 1
        _, rest = self._rounds(names[1:] + names[:1], more)  # another order than the first round's
        raw = {k: raw.get(k, []) + rest.get(k, []) for k in raw.keys() | rest.keys()}
        self.note(f"showdown: {', '.join(names)} and torch.compile timed interleaved over {more + 1} rounds")
        base = statistics.median(raw[BASELINE])
        self.refresh(results, forecasts, base)
        for r in results:
            f = _forecast(forecasts, r)
            if r.name in contenders and f is not None:
                f.showdown_ms = r.median_ms
        for name, r in baselines.items():
            ms = base if name == BASELINE else statistics.median(raw[name]) if raw.get(name) else None
            if r is not None and ms:
                own = r.median_ms
                _retimed(r, ms)
                r.own_median_ms = own

    def close(self, results: list[RunResult]) -> None:
        if self.timer is not None:
            for name in self.alive:
                self.timer.release(name)
        for r in results:
            r.step = None


def showdown_rounds(first_round_s: float) -> int:
    """Rounds of the showdown, given how long its first round took (see :data:`SHOWDOWN_ROUNDS`)."""
    fit = int(SHOWDOWN_BUDGET_S / first_round_s) if first_round_s > 0 else SHOWDOWN_ROUNDS
    return max(MIN_SHOWDOWN_ROUNDS, min(SHOWDOWN_ROUNDS, fit))


def _retimed(r: RunResult, median_ms: float) -> None:
    """``r``'s step from interleaved rounds. Those rounds give one ratio per round, not a step
    distribution, so the p90 keeps the own run's spread (p90 / median) around the new median:
    a p90 below the median it sits beside would be read as a bug."""
    if r.p90_ms and r.median_ms:
        r.p90_ms = r.p90_ms / r.median_ms * median_ms
    if r.tokens_per_s and r.median_ms:  # tokens per step (the batch) / step
        r.tokens_per_s = r.tokens_per_s * r.median_ms / median_ms
    r.median_ms, r.timing = median_ms, "interleaved"
