"""The python example of docs/autofusion_torch.md runs."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "autofusion_torch.md"


def test_the_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    exec(compile(block, str(DOC), "exec"), {"__name__": "doc_example"})
