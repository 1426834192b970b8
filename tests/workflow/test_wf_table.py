"""The terminal table keeps the key columns in narrow terminals and all of them in wide ones."""

from __future__ import annotations

from superkernel.tools.advisor.precision import Diff, Verdict
from superkernel.tools.advisor.results import RunResult
from superkernel.tools.advisor.table import COLUMNS, markdown_table, rich_table


def _results():
    eager = RunResult(name="eager", kind="baseline", median_ms=2.0, p90_ms=2.2, tokens_per_s=500.0, compile_s=0.0)
    plan = RunResult(name="attention / max-autotune", kind="plan", strategy="attention", mode="max-autotune",
                     scopes={"attention": ["model.layers.*.self_attn"]}, segments=4, median_ms=1.0, p90_ms=1.1,
                     tokens_per_s=1000.0, compile_s=12.0, speedup_vs_eager=2.0,
                     vs_reference=Diff(4e-7, 1.0, False, 5), vs_eager=Diff(4e-7, 1.0, False, 5),
                     verdict=Verdict(True, "rule", "ok"))
    failed = RunResult(name="mlp / reduce-overhead", kind="plan", strategy="mlp", mode="reduce-overhead",
                       scopes={"mlp": ["m"]}, segments=4, median_ms=1.5, p90_ms=1.6, tokens_per_s=666.0,
                       compile_s=1.0, vs_reference=Diff(1e-6, 1.0, False, 5), vs_eager=Diff(1e-6, 1.0, False, 5),
                       verdict=Verdict(False, "rule", "not bit-identical"))
    return [eager, plan, failed]


def test_wide_table_has_every_column_and_narrow_keeps_the_verdict():
    results = _results()
    wide = rich_table(results, results[1], "t", width=220)
    assert [c.header for c in wide.columns] == list(COLUMNS)
    narrow = rich_table(results, results[1], "t", width=100)
    headers = [c.header for c in narrow.columns]
    assert {"strategy", "mode", "ms med / p90", "x eager", "x compile", "diff ref", "status"} <= set(headers)
    assert "top-1" not in headers and narrow.caption


def test_markdown_table_marks_failures_and_the_recommendation():
    results = _results()
    text = markdown_table(results, results[1])
    lines = text.splitlines()
    assert len(lines) == 2 + len(results)
    assert "**attention** (recommended)" in lines[3]
    assert "**FAILED**" in lines[4] and "1.00e-06" in lines[4]
