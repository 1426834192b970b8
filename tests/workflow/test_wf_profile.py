"""Profiler-driven scope analysis: attribution per module kind, coverage, the auto search, the run log."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
import torch

from superkernel.tools.advisor.predict import PRIOR_EFFICIENCY, Forecast, covered_share, forecasts_for
from superkernel.tools.advisor.profile import KINDS, StepProfile, module_roles, profile_step
from superkernel.tools.advisor.results import RunResult
from superkernel.tools.advisor.precision import Verdict
from superkernel.tools.advisor.search import run_search
from superkernel.tools.advisor.strategies import ScopePlan, auto_plans, plan_for
from superkernel.tools.advisor.structure import analyze_structure

from .wf_helpers import run_cli


@pytest.fixture(scope="module")
def llama_profile(llama, llama_session):
    structure = analyze_structure(llama.model)
    return profile_step(llama_session, llama_session.step_fn(), structure=structure, steps=2)


def test_time_operators_launches_and_weights_are_attributed_per_kind_and_layer(llama, llama_profile):
    p = llama_profile
    kinds = {r.kind for r in p.rows}
    assert {"embedding", "attention", "mlp", "norm", "lm_head", "other"} <= kinds and "moe" not in kinds
    assert sorted({r.layer for r in p.rows if r.kind == "attention"}) == [0, 1, 2, 3]
    # self times partition the step: the kinds add up to the profiled step
    assert sum(r.ms for r in p.rows) == pytest.approx(p.step_ms, rel=1e-9)
    assert p.measured_ms > 0 and p.step_ms > 0
    # operator and launch counts are counted, not timed: every layer's attention runs the same operators
    attn = [r for r in p.rows if r.kind == "attention"]
    assert len({r.ops for r in attn}) == 1 and attn[0].ops > 10 and attn[0].launches >= 1
    assert sum(r.launches for r in p.rows) == pytest.approx(p.launches)
    assert sum(r.ops for r in p.rows) == pytest.approx(p.ops)
    # weights: each parameter counted once, the attention row holds exactly its module's parameters
    total = sum(t.numel() * t.element_size() for t in llama.model.parameters())
    assert p.weight_bytes == total and sum(r.weight_bytes for r in p.rows) == total
    attn0 = llama.model.get_submodule("model.layers.0.self_attn")
    assert attn[0].weight_bytes == sum(t.numel() * t.element_size() for t in attn0.parameters())
    data = json.loads(json.dumps(p.to_dict()))
    assert sum(v["share"] for v in data["kinds"].values()) == pytest.approx(1.0)
    assert set(data["kinds"]) == set(KINDS)


def test_module_roles_come_from_the_module_tree_of_a_moe_model(zoo):
    model = zoo["qwen3-moe-tiny"].model
    roles = {r.path: r.kind for r in module_roles(analyze_structure(model))}
    assert roles["model.layers.0.mlp"] == "moe" and roles["model.layers.0.self_attn"] == "attention"
    assert roles["model.embed_tokens"] == "embedding" and roles["lm_head"] == "lm_head"
    assert roles["model.layers.0"] == "other" and roles["model.norm"] == "norm"


def test_marks_count_calls_and_discount_the_hooks_cost_in_the_callers():
    from superkernel.tools.advisor.profile import ModuleRole, _Marks

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.b(self.a(x))

    model = torch.nn.Sequential(Layer())
    roles = [ModuleRole("0", "other", 0), ModuleRole("0.a", "attention", 0), ModuleRole("0.b", "mlp", 0)]
    marks = _Marks(model, roles, profiler=False)
    model(torch.zeros(1, 2))
    step = marks.take()           # this step's record; the live marks start anew
    marks.remove()
    assert (step.calls, marks.calls) == (3, 0)
    assert step.direct == {"0": 2} and step.nested["0"] == 2 and step.nested["0.a"] == 0
    step.exclusive.update({"0": 5.0, "0.a": 1.0, "0.b": 1.0})
    step.inclusive.update({"0": 7.0, "0.a": 1.0, "0.b": 1.0})
    # the hooks of a and b cost their caller (layer 0); three calls in all leave the step
    assert step.discount(0.5) == pytest.approx(1.5)
    assert step.exclusive == {"0": 4.0, "0.a": 1.0, "0.b": 1.0}
    assert step.inclusive["0"] == 6.0 and step.inclusive["0.a"] == 1.0
    model(torch.zeros(1, 2))      # removed: nothing more is counted
    assert marks.calls == 0


def test_marks_keep_the_fast_call_path_and_restore_every_forward():
    from superkernel.tools.advisor.profile import ModuleRole, _Marks

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    own = model[1].forward                      # a forward set on the instance (as a scope wrapper does)
    model[1].forward = own
    expected = model(torch.ones(1, 2))
    marks = _Marks(model, [ModuleRole("0", "mlp", 0), ModuleRole("1", "other", 0)], profiler=False)
    # timed without forward hooks: a hooked module leaves Module.__call__'s fast path
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    out = model(torch.ones(1, 2))
    assert marks.calls == 2 and torch.equal(out, expected)
    marks.remove()
    assert "forward" not in model[0].__dict__ and model[1].__dict__["forward"] is own
    model(torch.ones(1, 2))
    assert marks.calls == 2


def test_a_module_shared_under_two_paths_is_wrapped_once():
    from superkernel.tools.advisor.profile import ModuleRole, _Marks

    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)    # paths "0" and "2": one module
    marks = _Marks(model, [ModuleRole("0", "mlp", 0), ModuleRole("2", "mlp", 1)], profiler=False)
    model(torch.ones(1, 2))
    assert marks.calls == 2 and set(marks.inclusive) == {"0"}       # two calls, no call timed twice
    marks.remove()
    assert "forward" not in shared.__dict__


def test_wrappers_cost_is_calibrated_on_pairs_of_rounds_the_profile_does_not_use():
    from types import SimpleNamespace

    from superkernel.tools.advisor.profile_rounds import Round, in_model_cost, profile_pairs

    def rnd(hooked, calibration, level, calls=10):
        return Round(hooked, calibration, times=[level] * 4,
                     marks=[SimpleNamespace(calls=calls)] * 4 if hooked else [])

    # (wrapped, bare) pairs alternate: calibration, profile, calibration, ...
    levels = [(1.3, 1.0), (1.2, 1.0), (1.5, 1.0), (2.0, 1.0), (1.4, 1.0), (1.1, 1.0), (1.2, 1.0), (1.1, 1.0)]
    rounds = [r for i, (h, b) in enumerate(levels) for r in (rnd(True, i % 2 == 0, h), rnd(False, i % 2 == 0, b))]
    assert rounds[0].level == 1.3 and rounds[0].calls == 10
    # the median over the calibration pairs (0.3, 0.5, 0.4, 0.2) per call; the profile pairs play no part
    assert in_model_cost(rounds) == pytest.approx(0.035)
    chosen = profile_pairs(rounds, 0.035)
    # the middle half of the four profile pairs (1.2, 2.0, 1.1, 1.1) by (wrapped - cost) / bare: 2.0 and one 1.1 go
    assert sorted(h.level for h, _ in chosen) == [1.1, 1.2] and all(not h.calibration for h, _ in chosen)
    assert all(h.hooked and not b.hooked for h, b in chosen)
    # a bare round slower than its wrapped one does not make the cost negative
    assert in_model_cost([rnd(True, True, 1.0), rnd(False, True, 1.1)]) == 0.0


def test_the_profile_reports_the_calibrated_cost_and_the_marked_calls(llama, llama_profile):
    roles = module_roles(analyze_structure(llama.model))
    assert llama_profile.marked_calls == len(roles)      # every marked module once per decode step
    data = llama_profile.to_dict()
    assert data["marked_calls_per_step"] == len(roles) and data["wrapper_us_per_call"] >= 0.0
    assert not any("forward" in llama.model.get_submodule(r.path).__dict__ for r in roles)   # wrappers gone


def test_covered_share_grows_with_the_scopes(llama, llama_profile):
    structure = analyze_structure(llama.model)
    share = {s: covered_share(llama_profile, llama.model, plan_for(s, structure).scopes)
             for s in ("attention", "mlp", "decoder_layer", "all_layers")}
    assert share["all_layers"] == pytest.approx(share["decoder_layer"])
    assert share["attention"] + share["mlp"] < share["all_layers"] <= 1.0
    assert 0 < share["attention"] and 0 < share["mlp"]
    # a glob below the marked modules is charged nothing it did not time
    assert covered_share(llama_profile, llama.model, {"x": ["model.layers.*.self_attn.q_proj"]}) == 0.0


def _profile(step_ms: float, module_ms: dict[str, float]) -> StepProfile:
    return StepProfile(label="eager", step_ms=step_ms, measured_ms=step_ms, ops=0, launches=0, steps=1,
                       module_ms=module_ms)


def _plans() -> list[ScopePlan]:
    return [ScopePlan("attention", {"attention": ["a"]}), ScopePlan("mlp", {"mlp": ["m"]}),
            ScopePlan("all_layers", {"all_layers": ["a", "m"]})]


def _forecasts(shares: dict[str, float], modes=("reduce-overhead", "max-autotune")) -> list[Forecast]:
    return [Forecast(s, m, share, 1.0, 10, 1, 0) for s, share in shares.items() for m in modes]


def _fake_runner(measured: dict[str, float], calls: list[str]):
    def run(plan: ScopePlan, modes: tuple[str, ...]) -> list[RunResult]:
        out = []
        for mode in modes:
            calls.append(f"{plan.strategy} / {mode}")
            r = RunResult(name=f"{plan.strategy} / {mode}", kind="plan", strategy=plan.strategy, mode=mode,
                          scopes=plan.scopes, median_ms=measured[f"{plan.strategy} / {mode}"], p90_ms=1.0)
            r.verdict = Verdict(True, "test", "test")
            out.append(r)
        return out
    return run


MEASURED = {"all_layers / max-autotune": 2.0, "all_layers / reduce-overhead": 6.0,
            "attention / max-autotune": 5.0, "attention / reduce-overhead": 8.0,
            "mlp / max-autotune": 9.0, "mlp / reduce-overhead": 9.5}


def test_auto_search_tries_the_best_predicted_first_skips_and_stops():
    forecasts = _forecasts({"attention": 0.5, "mlp": 0.05, "all_layers": 0.9})
    calls: list[str] = []
    results = run_search(_plans(), ("reduce-overhead", "max-autotune"), forecasts, _fake_runner(MEASURED, calls),
                         base_ms=10.0, prior=PRIOR_EFFICIENCY, exhaustive=False)
    # the widest plan first in both modes (each mode's efficiency is unknown until one of its plans ran:
    # every plan is predicted at the base, the widest fused share goes first)
    assert set(calls) == {"all_layers / reduce-overhead", "all_layers / max-autotune"}
    assert [r.name for r in results] == calls
    by = {f.name: f for f in forecasts}
    assert by["mlp / max-autotune"].status == "skipped" and "covers 5%" in by["mlp / max-autotune"].reason
    att = by["attention / max-autotune"]
    assert att.status == "skipped" and "cannot beat the best measured plan (all_layers / max-autotune" in att.reason
    # calibrated: all_layers max-autotune removed (10 - 2) / (10 * 0.9) of its covered time
    assert att.predicted_ms == pytest.approx(10 * (1 - 0.5 * 8 / 9))
    assert all(f.prior_ms == pytest.approx(10.0) for f in forecasts)
    assert by["all_layers / max-autotune"].measured_ms == 2.0 and by["all_layers / max-autotune"].passed


def test_the_search_stops_when_the_calibrated_prediction_cannot_beat_the_best():
    forecasts = _forecasts({"attention": 0.5, "all_layers": 0.9}, modes=("max-autotune",))
    measured = dict(MEASURED, **{"all_layers / max-autotune": 9.0, "attention / max-autotune": 3.0})
    calls: list[str] = []
    run_search(_plans(), ("max-autotune",), forecasts, _fake_runner(measured, calls), base_ms=10.0, prior=0.5,
               exhaustive=False)
    # all_layers measured only 1.1x: its efficiency predicts attention at ~9.4 ms, not below 9 * 0.97: skipped
    assert calls == ["all_layers / max-autotune"]
    # a plan whose trial capture failed is skipped with the reason
    forecasts = _forecasts({"attention": 0.5, "all_layers": 0.9}, modes=("max-autotune",))
    forecasts[1].trial_error = "boom"
    calls = []
    run_search(_plans(), ("max-autotune",), forecasts, _fake_runner(measured, calls), base_ms=10.0, prior=0.5,
               exhaustive=False)
    assert calls == ["attention / max-autotune"] and "trial capture failed: boom" in forecasts[1].reason


def test_exhaustive_measures_every_plan_in_every_mode():
    forecasts = _forecasts({"attention": 0.5, "mlp": 0.05, "all_layers": 0.9})
    calls: list[str] = []
    run_search(_plans(), ("reduce-overhead", "max-autotune"), forecasts, _fake_runner(MEASURED, calls),
               base_ms=10.0, prior=0.5, exhaustive=True)
    assert sorted(calls) == sorted(MEASURED) and all(f.status == "measured" for f in forecasts)


def test_forecasts_use_the_trial_captures_cuts_and_segments(llama, llama_profile, llama_session):
    from superkernel.tools.advisor.analysis import trial_capture

    structure = analyze_structure(llama.model)
    plans = [p for p in auto_plans(structure) if p.strategy in ("attention", "all_layers")]
    trials = [trial_capture(llama_session, p) for p in plans]
    fc = {f.strategy: f for f in forecasts_for(plans, ("reduce-overhead",), llama_profile, llama.model, trials)}
    assert fc["all_layers"].segments == 1 and fc["attention"].segments == 4
    assert fc["all_layers"].launches_removed == trials[1].segments[0].num_ops - 1
    assert fc["all_layers"].launches_removed > fc["attention"].launches_removed > 0
    assert fc["attention"].fused_fraction == 1.0 and fc["attention"].trial_error is None


def test_run_log_takes_compiler_output_and_warnings_not_the_progress(tmp_path):
    from superkernel.tools.advisor.progress import Reporter
    from superkernel.tools.advisor.run_log import RunLog

    terminal = io.StringIO()
    old = sys.stderr
    sys.stderr = terminal
    handler = logging.StreamHandler()  # bound to the terminal stream, as torch's handlers are
    logger = logging.getLogger("torch._inductor.test_run_log")
    logger.addHandler(handler)
    try:
        reporter = Reporter()
        log = RunLog(tmp_path / "superkernel.log")
        with log.capture():
            sys.stderr.write("AUTOTUNE mm(1x256, 256x688)\n")
            print("a deprecation", file=sys.stderr)  # Python's warning display writes to sys.stderr when called
            logger.warning("inductor says hello")
            reporter.note("progress stays on the terminal")
        path = log.close()
    finally:
        sys.stderr = old
        logger.removeHandler(handler)
    text = path.read_text()
    assert "AUTOTUNE mm" in text and "a deprecation" in text and "inductor says hello" in text
    assert "progress stays" not in text and "progress stays on the terminal" in terminal.getvalue()
    assert "AUTOTUNE" not in terminal.getvalue() and "hello" not in terminal.getvalue()
    assert not list(tmp_path.glob(".superkernel.log.*"))      # renamed in place


# `analyze --profile --json` on llama-tiny (the profile in the JSON and on the terminal): checked by
# tests/workflow/test_wf_analyze.py::test_analyze_cli_on_every_zoo_model[llama-tiny], which runs it.


@pytest.mark.parametrize("arch", ["mistral", "opt"])
def test_analyze_profile_on_the_sweep_subset(arch, tmp_path):
    from superkernel.tools.models.archs import save_checkpoint

    ckpt = save_checkpoint(arch, tmp_path / arch)
    out = tmp_path / "a.json"
    # one plan's trial capture (the profile is the subject; every plan's: test_wf_analyze.py on the zoo)
    result = run_cli("analyze", "--model", str(ckpt), "--prompt-len", "4", "--strategy", "attention", "--profile",
                     "--json", str(out))
    assert result.code == 0, result.err
    prof = json.loads(out.read_text())["profile"]
    assert sum(r["ms"] for r in prof["rows"]) == pytest.approx(prof["step_ms"])
    # OPT's feed-forward is fc1/fc2 directly in the layer (no MLP module): its time is the layer's own ("other")
    expected = {"attention", "norm", "embedding", "lm_head"} | ({"mlp"} if arch == "mistral" else set())
    assert {r["kind"] for r in prof["rows"]} >= expected


def test_the_predicted_search_needs_auto_and_one_policy_is_given_once(monkeypatch):
    from superkernel.tools.advisor import workflow

    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    result = run_cli("optimize", "--strategy", "attention", "--search", "predicted")
    assert result.code == 2 and "--search predicted chooses among the plans of --strategy auto" in result.err
    result = run_cli("optimize", "--search", "all", "--exhaustive")
    assert result.code == 2 and "not allowed with argument" in result.err


def test_the_timed_pass_goes_on_while_the_pairs_scatter():
    from types import SimpleNamespace

    from superkernel.tools.advisor.profile_rounds import Round, settled

    def rounds(levels):   # (wrapped, bare) pairs, alternating calibration and profile
        return [r for i, (h, b) in enumerate(levels)
                for r in (Round(True, i % 2 == 0, [h] * 4, [SimpleNamespace(calls=10)] * 4),
                          Round(False, i % 2 == 0, [b] * 4))]

    steady = [(1.1 + 0.001 * (i % 3), 1.0) for i in range(16)]
    scattered = [(1.1 + 0.3 * (i % 3), 1.0 + 0.2 * (i % 2)) for i in range(16)]
    assert settled(rounds(steady)) and not settled(rounds(scattered))
    assert not settled(rounds(steady[:2]))          # too few pairs to tell


def test_a_long_step_stops_the_timed_pass_by_time_a_short_one_by_rounds():
    from types import SimpleNamespace

    from superkernel.tools.advisor.profile import MIN_ROUNDS, MIN_TIMED_S
    from superkernel.tools.advisor.profile_rounds import (LONG_MAX_TIMED_S, LONG_MIN_ROUNDS, LONG_TIMED_S, Round,
                                                          enough_rounds)

    def rounds(levels):   # (wrapped, bare) pairs, alternating calibration and profile
        return [r for i, (h, b) in enumerate(levels)
                for r in (Round(True, i % 2 == 0, [h] * 4, [SimpleNamespace(calls=10)] * 4),
                          Round(False, i % 2 == 0, [b] * 4))]

    steady = rounds([(1.1 + 0.001 * (i % 3), 1.0) for i in range(8)])
    scattered = rounds([(1.1 + 0.3 * (i % 3), 1.0 + 0.2 * (i % 2)) for i in range(8)])

    def stop(done, spent, rs, **kw):
        return enough_rounds(done, spent, rs, least=MIN_ROUNDS, enough=MIN_TIMED_S, interleaved=True,
                             check_settled=True, **kw)

    short = 2 * MIN_TIMED_S   # a tiny model: seconds after many rounds, never LONG_TIMED_S
    assert not stop(16, short, steady) and stop(MIN_ROUNDS, short, steady)
    assert not stop(MIN_ROUNDS, short, scattered)                     # goes on while the pairs scatter
    long_ = LONG_TIMED_S + 1   # a real-width step: seconds per round
    assert stop(16, long_, steady) and not stop(16, long_, scattered)
    assert stop(LONG_MIN_ROUNDS, LONG_MAX_TIMED_S, scattered)         # bounded wait, settled or not
    assert not stop(LONG_MIN_ROUNDS - 4, 10 * LONG_MAX_TIMED_S, steady)
    assert not stop(LONG_MIN_ROUNDS + 2, LONG_MAX_TIMED_S, steady)  # only whole calibration/profile pairs
    assert enough_rounds(4, 0.6, [], least=4, enough=0.5, interleaved=False, check_settled=False)


def test_a_mode_whose_widest_plan_lost_to_the_plain_compile_tries_narrower_scopes():
    """gemma2 (reduce-overhead): all_layers ran slower than the whole step compiled without scopes; the
    calibrated efficiency is then negative and the narrower attention plan is predicted (and was) faster."""
    forecasts = _forecasts({"attention": 0.4, "mlp": 0.05, "all_layers": 0.8}, modes=("reduce-overhead",))
    measured = {"all_layers / reduce-overhead": 1.3, "attention / reduce-overhead": 0.9,
                "mlp / reduce-overhead": 1.0}
    calls: list[str] = []
    run_search(_plans(), ("reduce-overhead",), forecasts, _fake_runner(measured, calls), base_ms=1.0, prior=0.8,
               exhaustive=False)
    assert calls == ["all_layers / reduce-overhead", "attention / reduce-overhead"]
    by = {f.name: f for f in forecasts}
    # efficiency (1 - 1.3) / 0.8 = -0.375: attention predicted 1.0 x (1 + 0.4 x 0.375) = 1.15 < 1.3 x 0.97
    assert by["attention / reduce-overhead"].predicted_ms == pytest.approx(1.15)
    assert by["mlp / reduce-overhead"].status == "skipped" and "covers 5%" in by["mlp / reduce-overhead"].reason


def test_a_plan_far_faster_than_the_base_predicts_its_equal_share_twin_at_its_own_step():
    """qwen2_moe: all_layers / reduce-overhead ran 10x faster than plain torch.compile (the base); the
    efficiency (above 1) is not bounded, so decoder_layer (same fused share) is predicted at that step."""
    forecasts = [Forecast("all_layers", "reduce-overhead", 0.72, 1.0, 10, 1, 0),
                 Forecast("decoder_layer", "reduce-overhead", 0.72, 1.0, 10, 2, 0),
                 Forecast("attention", "reduce-overhead", 0.27, 1.0, 10, 2, 0)]
    plans = [ScopePlan("all_layers", {"a": ["x"]}), ScopePlan("decoder_layer", {"d": ["x"]}),
             ScopePlan("attention", {"t": ["x"]})]
    calls: list[str] = []
    run_search(plans, ("reduce-overhead",), forecasts, _fake_runner({"all_layers / reduce-overhead": 1.344}, calls),
               base_ms=14.3, prior=PRIOR_EFFICIENCY, exhaustive=False)
    assert calls == ["all_layers / reduce-overhead"]  # the fewest segments first among equal predictions
    by = {f.strategy: f for f in forecasts}
    assert by["decoder_layer"].predicted_ms == pytest.approx(1.344) and by["decoder_layer"].status == "skipped"
    eff = (14.3 - 1.344) / (14.3 * 0.72)
    assert eff > 1 and by["attention"].predicted_ms == pytest.approx(14.3 * (1 - 0.27 * eff))
