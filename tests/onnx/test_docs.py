"""The command lines in docs/graph_autofusion.md run and give the documented exit codes."""

import os
import re
import shlex
import subprocess
import sys

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "graph_autofusion.md")


def documented_commands():
    text = open(DOC, encoding="utf-8").read()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                cmd, _, comment = line[2:].partition("#")
                m = re.search(r"exit (\d+)", comment)
                cmds.append((cmd.strip(), int(m.group(1)) if m else 0))
    return cmds


def test_docs_have_examples_for_the_main_flags():
    text = " ".join(c for c, _ in documented_commands())
    for flag in ("--fusion-rules", "--opt-level", "--report", "--benchmark", "--list-rules", "--dim", "--debug"):
        assert flag in text


def test_documented_commands_run(tmp_path):
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    for cmd, want in documented_commands():
        argv = shlex.split(cmd)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "graph-autofusion":
            argv[0] = os.path.join(bindir, "graph-autofusion")
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == want, f"{cmd}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert (tmp_path / "llama_fused.onnx").exists() and (tmp_path / "report.json").exists()
    assert not (tmp_path / "strict.onnx").exists()
