"""The command lines in docs/graph_autofusion.md run and give the documented exit codes.

``python -m superkernel.onnx.zoo`` and ``graph-autofusion`` are run in this process through
the functions their entry points call (``zoo.main``, ``cli.main``, with the documented argv
and working directory), which skips a torch and onnxruntime import per command; one call goes
through the installed ``graph-autofusion`` script to check the entry point itself."""

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys

from superkernel.onnx import cli, zoo

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "graph_autofusion.md")
ENTRY_POINTS = {("python", "-m", "superkernel.onnx.zoo"): zoo.main, ("graph-autofusion",): cli.main}


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


def _in_process(argv: list[str], cwd) -> tuple[int, str]:
    for prefix, fn in ENTRY_POINTS.items():
        if tuple(argv[:len(prefix)]) == prefix:
            out = io.StringIO()
            old = os.getcwd()
            os.chdir(cwd)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    try:
                        code = fn(argv[len(prefix):])
                    except SystemExit as e:  # argparse
                        code = e.code
            finally:
                os.chdir(old)
            return int(code or 0), out.getvalue()
    raise AssertionError(f"documented command with an unknown entry point: {argv}")


def test_documented_commands_run(tmp_path):
    cmds = documented_commands()
    assert all(shlex.split(c)[0] in ("python", "graph-autofusion") for c, _ in cmds)
    for cmd, want in cmds:
        code, out = _in_process(shlex.split(cmd), tmp_path)
        assert code == want, f"{cmd}: exit {code}\n{out[-3000:]}"
    assert (tmp_path / "llama_fused.onnx").exists() and (tmp_path / "report.json").exists()
    assert not (tmp_path / "strict.onnx").exists()


def test_installed_entry_point_runs(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "graph-autofusion")
    r = subprocess.run([exe, "--list-rules"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "matmul_concat" in r.stdout, r.stderr[-2000:]
