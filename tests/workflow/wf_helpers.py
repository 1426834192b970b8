"""Helpers shared by the workflow tests (importable, unlike conftest.py)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

ZOO_NAMES = ("llama-tiny", "qwen3-moe-tiny", "deepseek-v3-tiny")

#: The decode shapes of the llama-tiny CLI runs (the e2e ``optimize``, its failure paths, ``bench``, and
#: docs/workflow.md's quick example; ``llama_session`` prepares the same): one static-cache length gives one
#: set of graphs, so the plain torch.compile baseline and the reduce-overhead native modules the first of these
#: runs compiles are loaded from the Inductor and superkernel caches by the others.
E2E_SHAPES = ("--prompt-len", "8", "--warmup", "1", "--steps", "3")


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
