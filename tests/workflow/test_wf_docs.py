"""docs/workflow.md: its examples run as written, and it documents every flag."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from superkernel.tools import cli
from superkernel.tools.advisor.plan_file import read_plan
from tests._doc_module import doc_module

from .test_wf_analyze import EXPECTED_TRIALS, check_profile, check_zoo_analysis
from .wf_helpers import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "workflow.md"


def doc_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block right after a ``<!-- tested -->`` line."""
    text = DOC.read_text()
    return re.findall(r"<!-- tested -->\s*```(\w+)\n(.*?)```", text, flags=re.S)


def test_doc_has_tested_examples_of_each_command():
    blocks = doc_blocks()
    commands = {code.split()[1] for lang, code in blocks if lang == "bash"}
    assert commands == {"analyze", "optimize", "bench"}
    assert any(lang == "python" and "superkernel.apply" in code for lang, code in blocks)


def check_generate_report(report: Path, plan, out: str) -> None:
    """What ``bench --generate --report`` wrote and printed: every peer generated eager's tokens on every round and
    has a rate, a time to first token and a first call; the plan's row names its strategy and mode and its compile
    time."""
    data = json.loads(report.with_suffix(".json").read_text())
    rows = {r["peer"]: r for r in data["rows"]}
    planned = (f"superkernel generate() ({plan.strategy or 'plan'} / {plan.mode})" if plan.backend == "superkernel"
               else "plan generate() (backend: torch.compile)")
    assert set(rows) == {"eager generate()", "torch.compile generate()", planned}
    for row in rows.values():
        assert row["error"] is None
        assert row["tokens_equal_eager_every_round"] is True
        assert row["tokens_per_s"] > 0 and row["ttft_ms"] > 0 and row["first_call_s"] > 0
    assert "TTFT ms" in report.read_text() and "tokens/s" in out
    assert rows[planned]["compile_s"] is not None


def test_doc_examples_run(tmp_path, monkeypatch):
    """Every tested block, as written (the CLI gets ``--quiet``, analyze ``--json`` to be checked).

    The ``bench --generate --report`` block is the suite's run of that command: its report is checked here.

    The analysis of the deepseek-v3-tiny example is checked as test_wf_analyze.py checks every zoo
    model's (that test leaves this model to this run rather than analyzing it a second time).
    """
    monkeypatch.chdir(tmp_path)
    analyzed, generated = [], []
    for lang, code in doc_blocks():  # in order: optimize writes the yaml that bench and Python read
        if lang == "bash":
            argv = shlex.split(code.strip())
            assert argv[0] == "superkernel"
            if argv[1] == "analyze":
                extra = ["--json", str(tmp_path / f"analysis_{len(analyzed)}.json")]
            else:
                extra = ["--quiet"]
            result = run_cli(*argv[1:], *extra)
            assert result.code == 0, f"{code}\n{result.err}"
            if argv[1] == "analyze":
                analyzed.append((argv, extra[1], result.out))
            if "--generate" in argv:
                generated.append(result.out)
        else:
            exec(compile(code, str(DOC), "exec"), doc_module(monkeypatch).__dict__)
    assert (tmp_path / "sk_quick" / "superkernel.yaml").is_file()
    (generate_out,) = generated
    check_generate_report(tmp_path / "generate.md", read_plan(tmp_path / "sk_quick" / "superkernel.yaml"), generate_out)
    (argv, path, out), = analyzed
    assert argv[2:] == ["--model", "deepseek-v3-tiny", "--profile"], \
        "test_wf_analyze.py leaves deepseek-v3-tiny to this example: analyze it there again if the example changes"
    data = json.loads(Path(path).read_text())
    check_zoo_analysis("deepseek-v3-tiny", data, out)
    check_profile(data, out, EXPECTED_TRIALS["deepseek-v3-tiny"])


@pytest.mark.parametrize("command", ["optimize", "analyze", "bench"])
def test_doc_mentions_every_flag(command):
    text = DOC.read_text()
    sub = next(a for a in cli.build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    section = text.split(f"## `superkernel {command}`", 1)[1].split("\n## ", 1)[0]
    for action in sub._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert flag in section, f"{command} {flag} is not documented"
