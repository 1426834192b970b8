"""Every command line in docs/distributed.md's bash blocks is one the ``superkernel`` parser accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from superkernel.tools.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"


def _commands() -> list[list[str]]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if "superkernel" in words:
                out.append(words[words.index("superkernel") + 1:])
    return out


COMMANDS = _commands()


def test_the_doc_has_the_commands():
    assert {c[0] for c in COMMANDS} == {"optimize", "bench", "static-compile"}
    assert any("--rebuild" in c for c in COMMANDS)


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_each_command_parses(argv):
    args = build_parser().parse_args(argv)
    assert args.func is not None and (args.nproc == 2 or args.nproc == 4 or "--nproc" not in argv)
