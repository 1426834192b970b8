"""The auto search's decisions under noisy timing: the real search code (search.run_search and
predict.next_decision), with the compile-and-measure step and the interleaved timer replaced at
their seams by functions that return given numbers (no compiler involved, no timing asserted)."""

from __future__ import annotations

import pytest

from superkernel.tools.advisor.precision import Verdict
from superkernel.tools.advisor.predict import PRIOR_EFFICIENCY, Forecast
from superkernel.tools.advisor.results import RunResult, decide
from superkernel.tools.advisor.search import BASELINE, run_search
from superkernel.tools.advisor.strategies import ScopePlan

RO, MA = "reduce-overhead", "max-autotune"


def _runner(own_ms: dict[str, float], calls: list[str], compile_s: dict[str, float] | None = None):
    """What run_plan returns for a plan: its own run's median (``own_ms``) and compile time."""
    def run(plan: ScopePlan, modes: tuple[str, ...]) -> list[RunResult]:
        out = []
        for mode in modes:
            name = f"{plan.strategy} / {mode}"
            calls.append(name)
            r = RunResult(name=name, kind="plan", strategy=plan.strategy, mode=mode, scopes=plan.scopes,
                          median_ms=own_ms[name], p90_ms=own_ms[name], compile_s=(compile_s or {}).get(mode, 0.2))
            r.verdict = Verdict(True, "test", "test")
            out.append(r)
        return out
    return run


class FakeTimer:
    """Interleaved rounds from scripts: per name, a list of step times (ms) handed out one per round;
    the baseline reads ``base`` every round. Records every retime call."""

    def __init__(self, scripts: dict[str, list[float]], base: float = 1.0):
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.base = base
        self.calls: list[tuple[list[str], int]] = []
        self.released: list[str] = []

    def retime(self, names: list[str], rounds: int) -> dict[str, list[float]]:
        self.calls.append((list(names), rounds))
        out = {BASELINE: [self.base] * rounds}
        for n in names:
            script = self.scripts.setdefault(n, [2.0])  # eager: 2 ms
            out[n] = [script.pop(0) if len(script) > 1 else script[0] for _ in range(rounds)]
        return out

    def release(self, name: str) -> None:
        self.released.append(name)

    def rounds_of(self, name: str) -> int:
        return sum(rounds for names, rounds in self.calls if name in names)


def _search(forecasts, plans, own_ms, timer, *, base_ms=1.0, base_compile_s=1.0, compile_s=None, modes=(RO,)):
    """``compile_s``: per mode (default 0.2 s: cheap against the baseline's 1 s)."""
    calls: list[str] = []
    results = run_search(plans, modes, forecasts, _runner(own_ms, calls, compile_s), base_ms=base_ms,
                         prior=PRIOR_EFFICIENCY, exhaustive=False, timer=timer, base_compile_s=base_compile_s)
    return calls, results, {f.name: f for f in forecasts}


def _twins(mode=RO):
    """all_layers and decoder_layer cover the same share (gpt_neox: 59% both); attention less."""
    forecasts = [Forecast("all_layers", mode, 0.6, 1.0, 10, 1, 0), Forecast("decoder_layer", mode, 0.6, 1.0, 10, 2, 0),
                 Forecast("attention", mode, 0.2, 1.0, 5, 4, 0)]
    plans = [ScopePlan("all_layers", {"a": ["x"]}), ScopePlan("decoder_layer", {"d": ["x"]}),
             ScopePlan("attention", {"t": ["x"]})]
    return forecasts, plans


def test_an_outlier_own_run_is_timed_again_and_does_not_decide():
    """llama-tiny under load: a plan's own run read 18x its real step; the interleaved rounds disagree with
    it, so the plan is timed again (twice the rounds) and counts at the interleaved median."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.8], "decoder_layer / reduce-overhead": [0.8]})
    own = {"all_layers / reduce-overhead": 14.4, "decoder_layer / reduce-overhead": 0.8,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    first = by["all_layers / reduce-overhead"]
    assert "its own run read 14.400 ms" in first.remeasured
    assert timer.rounds_of("all_layers / reduce-overhead") >= 3 + 6
    assert first.measured_ms == 0.8 and results[0].own_median_ms == 14.4 and results[0].timing == "interleaved"


def test_rounds_that_disagree_are_timed_again_and_the_median_wins():
    forecasts, plans = _twins()
    # one round of three read 9x (a burst of load): the rounds disagree, three more... six more rounds
    timer = FakeTimer({"all_layers / reduce-overhead": [0.7, 6.3, 0.7, 0.7], "decoder_layer / reduce-overhead": [0.9]})
    own = {"all_layers / reduce-overhead": 0.7, "decoder_layer / reduce-overhead": 0.9,
           "attention / reduce-overhead": 1.0}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert "rounds disagree" in by["all_layers / reduce-overhead"].remeasured
    assert by["all_layers / reduce-overhead"].measured_ms == 0.7
    assert decide(results).plan.name == "all_layers / reduce-overhead"


def test_a_prediction_that_ties_the_best_is_measured_when_its_mode_compiles_cheaply():
    """gpt_neox: decoder_layer / reduce-overhead has all_layers' share (same prediction) and ran 1.17x faster."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.60], "decoder_layer / reduce-overhead": [0.51]})
    own = {"all_layers / reduce-overhead": 0.60, "decoder_layer / reduce-overhead": 0.51,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer, compile_s={RO: 0.4})
    assert calls[:2] == ["all_layers / reduce-overhead", "decoder_layer / reduce-overhead"]
    twin = by["decoder_layer / reduce-overhead"]
    assert twin.status == "measured" and "ties the best measured plan" in twin.reason
    assert decide(results).plan.name == "decoder_layer / reduce-overhead"


def test_a_tie_is_skipped_when_its_mode_compiles_slowly():
    forecasts, plans = _twins(MA)
    timer = FakeTimer({"all_layers / max-autotune": [0.60], "decoder_layer / max-autotune": [0.51]})
    own = {"all_layers / max-autotune": 0.60, "decoder_layer / max-autotune": 0.51, "attention / max-autotune": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer, compile_s={MA: 4.0}, base_compile_s=5.0, modes=(MA,))
    assert calls == ["all_layers / max-autotune"]
    twin = by["decoder_layer / max-autotune"]
    assert twin.status == "skipped" and "not cheap" in twin.reason and "ties the best" in twin.reason


@pytest.mark.parametrize("mode", [MA, RO])
def test_of_tied_plans_the_smaller_segments_compile_first(mode):
    """SmolLM2's 30 identical layers: decoder_layer's segments are one Inductor compile / one native function,
    all_layers' one segment is the whole stack (cold: max-autotune 167 s vs 381 s, reduce-overhead 84 s vs 98 s).
    decoder_layer is measured first and the tie skipped (neither mode compiles cheaply there)."""
    forecasts, plans = _twins(mode)
    by_strategy = {f.strategy: f for f in forecasts}
    by_strategy["all_layers"].largest_segment = 2369
    by_strategy["decoder_layer"].largest_segment = 79
    scripts = {f"{s} / {mode}": [0.6] for s in ("all_layers", "decoder_layer")}
    own = {f"{s} / {mode}": 0.6 for s in ("all_layers", "decoder_layer", "attention")}
    calls, _, by = _search(forecasts, plans, own, FakeTimer(scripts), compile_s={mode: 4.0}, base_compile_s=5.0,
                           modes=(mode,))
    assert calls == [f"decoder_layer / {mode}"]
    other = by[f"all_layers / {mode}"]
    assert other.status == "skipped" and "ties the best" in other.reason


def test_the_showdown_picks_the_faster_of_two_close_candidates():
    """Two plans within the showdown margin after their own rounds; timed together, the second is faster."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.60, 0.60, 0.60, 0.60, 0.60, 0.60, 0.62],
                       "decoder_layer / reduce-overhead": [0.61, 0.61, 0.61, 0.55]})
    own = {"all_layers / reduce-overhead": 0.60, "decoder_layer / reduce-overhead": 0.61,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert set(timer.calls[-1][0]) == {"all_layers / reduce-overhead", "decoder_layer / reduce-overhead"}
    assert by["decoder_layer / reduce-overhead"].showdown_ms == 0.55
    assert by["all_layers / reduce-overhead"].showdown_ms == 0.62
    assert decide(results).plan.name == "decoder_layer / reduce-overhead"
    assert sorted(timer.released) == sorted(["all_layers / reduce-overhead", "decoder_layer / reduce-overhead"])
    assert all(r.step is None for r in results)


def test_a_candidate_far_slower_than_the_best_is_released_early():
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.5], "decoder_layer / reduce-overhead": [0.9]})
    own = {"all_layers / reduce-overhead": 0.5, "decoder_layer / reduce-overhead": 0.9,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert timer.released[0] == "decoder_layer / reduce-overhead"  # released before the search ended
    assert decide(results).plan.name == "all_layers / reduce-overhead"


def test_kept_candidates_stay_compiled_while_the_next_plan_compiles(llama_session):
    """The real timer: two plans, each on its own session copy, compiled from their own code objects with
    no reset in between; running the first again after the second compiled neither compiles it again nor
    changes its logits, and the baseline (here the eager step) is timed in every round."""
    import torch

    import superkernel
    from superkernel.tools.advisor.compiling import compile_superkernel
    from superkernel.tools.advisor.retime import Interleaved, session_copy
    from superkernel.tools.decode import run_decode

    timer = Interleaved(llama_session, llama_session.step_fn())
    kept = {}
    try:
        for strategy, glob in (("attention", "model.layers.*.self_attn"), ("mlp", "model.layers.*.mlp")):
            own = session_copy(llama_session)
            superkernel.apply_scopes(own.model, {strategy: [glob]})
            step, _ = compile_superkernel(own, RO, keep=True, precompiled=False)  # through Dynamo, as max-autotune
            first = run_decode(own, step)
            kept[strategy] = (own, step, first.logits)
            timer.add(strategy, own, step)
        own, step, logits = kept["attention"]
        again = run_decode(own, step)
        assert again.dynamo.graphs_first == 0 and again.dynamo.recompiles_first == 0  # not compiled again
        assert again.dynamo.recompiles_warmup == again.dynamo.recompiles_timed == 0 and torch.equal(again.logits, logits)
        got = timer.retime(["attention", "mlp"], 2)
        assert set(got) == {BASELINE, "attention", "mlp"} and all(len(v) == 2 and min(v) > 0 for v in got.values())
        timer.release("mlp")
        assert set(timer.retime(["attention"], 1)) == {BASELINE, "attention"}
        # the original session's model has no scopes: each plan's scopes live on its copy
        from superkernel.scope_apply import scoped_modules

        assert scoped_modules(llama_session.model) == {} and scoped_modules(kept["mlp"][0].model)
    finally:
        timer.close()
        torch._dynamo.reset()


def test_the_report_shows_own_run_rounds_and_why_a_plan_was_timed_again():
    from superkernel.tools.advisor.profile_report import search_lines

    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.8], "decoder_layer / reduce-overhead": [0.8]})
    own = {"all_layers / reduce-overhead": 14.4, "decoder_layer / reduce-overhead": 0.8,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    text = "\n".join(search_lines(forecasts, 2.0, PRIOR_EFFICIENCY, "predicted", 1.0, results))
    row = next(line for line in text.splitlines() if line.startswith("| `all_layers / reduce-overhead`"))
    assert "14.400 ms / 17 / 0.2" in row  # 3 + 6 again + 3 beside decoder_layer + 5 showdown and "timed again: its own run read 14.400 ms" in row
    assert "interleaved with plain torch.compile" in text


def test_a_noisy_baseline_run_does_not_make_eager_win():
    """llama-tiny under load: plain torch.compile's own run read 11 ms (eager: 4.3 ms); in the interleaved
    rounds it runs 1.5 ms and the plan 1.1 ms. Every step the recommendation compares comes from the
    showdown's rounds (eager and plain torch.compile included), so the plan is recommended."""
    forecasts, plans = _twins()
    eager = RunResult(name="eager", kind="baseline", median_ms=4.3, p90_ms=4.4)
    inductor = RunResult(name=BASELINE, kind="baseline", median_ms=11.0, p90_ms=13.2)
    timer = FakeTimer({"all_layers / reduce-overhead": [1.1], "decoder_layer / reduce-overhead": [1.3],
                       "eager": [4.3]}, base=1.5)
    own = {"all_layers / reduce-overhead": 1.1, "decoder_layer / reduce-overhead": 1.3,
           "attention / reduce-overhead": 1.4}
    calls: list[str] = []
    results = run_search(plans, (RO,), forecasts, _runner(own, calls), base_ms=11.0, prior=PRIOR_EFFICIENCY,
                         exhaustive=False, timer=timer, base_compile_s=1.0,
                         baselines={"eager": eager, BASELINE: inductor})
    assert inductor.median_ms == 1.5 and inductor.own_median_ms == 11.0 and eager.median_ms == 4.3
    assert "eager" in timer.calls[-1][0]
    decision = decide([eager, inductor] + results)
    assert decision.kind == "plan" and decision.plan.name == "all_layers / reduce-overhead"
    assert decision.plan.median_ms == 1.1
    # the re-timed median keeps the own run's p90 / median spread (never a p90 below its median)
    assert inductor.p90_ms == pytest.approx(1.5 * 1.2)


def test_every_kept_candidate_meets_in_the_showdown():
    """qwen2_moe under load: a plan 7% behind the best before the showdown was the faster one in it; every
    candidate still kept (within 15% of the best) is timed in the showdown, and the showdown decides."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.70] * 6 + [0.80],
                       "decoder_layer / reduce-overhead": [0.75]})
    own = {"all_layers / reduce-overhead": 0.70, "decoder_layer / reduce-overhead": 0.75,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert {"all_layers / reduce-overhead", "decoder_layer / reduce-overhead"} <= set(timer.calls[-1][0])
    assert by["all_layers / reduce-overhead"].showdown_ms == 0.80
    assert decide(results).plan.name == "decoder_layer / reduce-overhead"


def test_a_near_prediction_with_another_share_is_skipped_not_measured_as_a_tie():
    """llama-tiny: reduce-overhead removed ~nothing over plain torch.compile, so every plan is predicted near
    the base; only the plan with the measured plan's share is a tie (measured), a narrower one is skipped."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.99], "decoder_layer / reduce-overhead": [0.99]})
    own = {"all_layers / reduce-overhead": 0.99, "decoder_layer / reduce-overhead": 0.99,
           "attention / reduce-overhead": 0.99}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert calls == ["all_layers / reduce-overhead", "decoder_layer / reduce-overhead"]
    att = by["attention / reduce-overhead"]
    assert att.predicted_ms < 0.99 * 1.03 and att.status == "skipped" and "cannot beat" in att.reason


def test_the_showdown_takes_fewer_rounds_when_a_round_is_long():
    from superkernel.tools.advisor.search import (MIN_SHOWDOWN_ROUNDS, SHOWDOWN_BUDGET_S, SHOWDOWN_ROUNDS,
                                                  showdown_rounds)

    assert showdown_rounds(0.05) == SHOWDOWN_ROUNDS                      # a tiny model: every round
    assert showdown_rounds(SHOWDOWN_BUDGET_S / 4) == 4
    assert showdown_rounds(SHOWDOWN_BUDGET_S) == MIN_SHOWDOWN_ROUNDS      # never fewer than a median needs


def test_a_candidate_whose_own_run_is_fast_is_not_freed_on_a_few_slow_rounds():
    """gpt_neox under load: the fastest own run read slow over its first rounds; it stays for the showdown."""
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.74] * 6 + [0.45],
                       "decoder_layer / reduce-overhead": [0.60]})
    own = {"all_layers / reduce-overhead": 0.44, "decoder_layer / reduce-overhead": 0.60,
           "attention / reduce-overhead": 0.9}
    calls, results, by = _search(forecasts, plans, own, timer)
    assert "all_layers / reduce-overhead" in timer.calls[-1][0]           # in the showdown
    assert decide(results).plan.name == "all_layers / reduce-overhead"
    # a candidate slow by its rounds and by its own run is still freed early
    forecasts, plans = _twins()
    timer = FakeTimer({"all_layers / reduce-overhead": [0.74] * 6 + [0.45],
                       "decoder_layer / reduce-overhead": [0.60]})
    own["all_layers / reduce-overhead"] = 0.74
    calls, results, by = _search(forecasts, plans, own, timer)
    assert "all_layers / reduce-overhead" not in timer.calls[-1][0]
