"""The Python example of docs/static_kernel.md runs, and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "static_kernel.md"


def test_static_kernel_doc_example_runs(tmp_path, monkeypatch, capsys):
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUPERKERNEL_STATIC_VERIFY", "0")  # the fresh-process load check: covered elsewhere
    torch._dynamo.reset()
    namespace: dict = {"__name__": "__doc_example__"}
    exec(compile(code, str(DOC), "exec"), namespace)
    assert capsys.readouterr().out.strip() == "1 partitions compiled, 1 frame built"
    pkgs = list(Path(namespace["build_dir"]).glob("static_kernel_outputs/*/static_kernel_*.skpkg"))
    assert len(pkgs) == 1
