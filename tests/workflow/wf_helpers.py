"""Helpers shared by the workflow tests (importable, unlike conftest.py)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

ZOO_NAMES = ("llama-tiny", "qwen3-moe-tiny", "deepseek-v3-tiny")


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*argv: str) -> CliResult:
    """Run ``superkernel.tools.cli.main`` in-process and capture its output."""
    from superkernel.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def error_lines(text: str) -> list[str]:
    """Non-empty stderr lines other than finished progress bars and library warnings."""
    return [line for line in text.splitlines()
            if line.strip() and "━" not in line and "Warning" not in line and not line.startswith("  warnings.")]
