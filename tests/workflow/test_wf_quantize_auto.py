"""``optimize --quantize auto`` (issue 58): the screen by KL, one workflow per candidate within the budget, the
fastest recommended step chosen, its plan reproduced by ``bench --config``; the choice rule and the usage errors."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from superkernel.tools.advisor.auto_quant import FLOAT, Screened, _message, choose

from .wf_helpers import error_lines, run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "real_models.md"


def _doc_commands() -> list[list[str]]:
    """The argv of each line of docs/real_models.md's tested block that runs ``--quantize auto``."""
    blocks = re.findall(r"<!-- tested -->\s*```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "--quantize auto" in b]
    return [shlex.split(line) for line in block.strip().splitlines()]


def _row(name: str, ms: float | None, kl: float, kind: str = "plan", noise: float = 0.03, **kw) -> Screened:
    return Screened(name, kl_mean=kl, step_ms=ms, kind=kind, noise=noise, recommended="decoder_layer / max-autotune",
                    **kw)


def test_choose_takes_the_fastest_and_the_least_kl_within_noise():
    rows = [_row(FLOAT, 10.0, 0.0), _row("int8-weight", 6.0, 4e-3), _row("w8a8", 5.0, 3e-2)]
    assert choose(rows).name == "w8a8"                                   # clearly fastest
    rows[2].step_ms = 5.9                                               # within 3 % of int8-weight's 6.0
    assert choose(rows).name == "int8-weight"                            # the timer cannot tell them apart: less KL
    rows[1].skipped = "over the budget"
    rows[2].kind = "none"                                               # its run recommended nothing
    assert choose(rows).name == FLOAT


def test_a_budget_nothing_meets_gives_the_float_plan_in_one_line():
    rows = [_row(FLOAT, 10.0, 0.0), _row("int8-weight", None, 4e-3, skipped="over the budget: ..."),
            _row("int4-weight", None, 0.4, skipped="over the budget: ...")]
    chosen = choose(rows)
    message = _message(rows, chosen, 1e-3)
    assert chosen.name == FLOAT and "\n" not in message
    assert message.startswith("no quantization stays within --max-kl 0.001 on this model: the float plan"), message


@pytest.mark.parametrize("argv, expected", [
    (["--max-kl", "0.1"], "--max-kl is the budget of --quantize auto"),
    (["--quantize", "auto", "--max-kl", "-1"], "--max-kl must be a number > 0"),
    (["--quantize", "auto", "--group-size", "32"], "--group-size does not apply to --quantize auto"),
])
def test_usage_errors_are_one_line_before_any_work(tmp_path, argv, expected):
    out = tmp_path / "out"
    result = run_cli("optimize", "--model", "llama-tiny", "--output", str(out), "--quiet", *argv)
    assert result.code == 2, (result.code, result.err)
    lines = error_lines(result.err)
    assert len(lines) == 1 and expected in lines[0], result.err
    assert not out.exists()


@pytest.mark.slow
def test_documented_auto_run_screens_compiles_within_budget_and_bench_reproduces(tmp_path, monkeypatch):
    optimize, bench = _doc_commands()
    assert optimize[:2] == ["superkernel", "optimize"] and bench[:2] == ["superkernel", "bench"]
    monkeypatch.chdir(tmp_path)
    result = run_cli(*optimize[1:], "--quiet")
    assert result.code == 0, result.err
    out = tmp_path / optimize[optimize.index("--output") + 1]
    data = json.loads((out / "results.json").read_text())
    budget = float(optimize[optimize.index("--max-kl") + 1])
    rows = {c["name"]: c for c in data["candidates"]}
    assert set(rows) == {FLOAT, "int8-weight", "w8a8", "int4-weight", "w4a8"}
    assert "no group size" in rows["int4-weight"]["skipped"]            # llama-tiny's 688-wide down_proj
    for name, row in rows.items():
        if row["kl_mean"] is None:
            continue
        assert (row["kl_mean"] <= budget) == (not row["skipped"]), row  # compiled exactly when within the budget
        if not row["skipped"]:
            assert (out / name / "results.json").is_file() and row["step_ms"] > 0
    assert rows["int8-weight"]["kl_mean"] <= budget < rows["w8a8"]["kl_mean"]  # the doc's budget picks between them
    assert choose([Screened(**{**c, "output": None}) for c in data["candidates"]]).name == data["chosen"]
    report = (out / "superkernel_optimization_report.md").read_text()
    assert "| candidate | mean KL |" in report and data["message"] in report
    plan = out / "superkernel.yaml"
    assert plan.read_text() == (out / data["chosen"] / "superkernel.yaml").read_text()
    bench_result = run_cli(*bench[1:], "--quiet")
    assert bench_result.code == 0, bench_result.err
    if data["chosen"] != FLOAT:
        assert f"quantized {data['chosen']} as the plan records" in bench_result.out, bench_result.out
