"""Every ```python block right after a ``<!-- tested -->`` line of docs/vllm.md runs, as the script a user would
save (vLLM starts its engine in a child process, so each block runs in a fresh interpreter). Skips where vLLM is
not importable (``make test-vllm`` runs it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
TESTED = re.compile(r"<!-- tested -->\n```python\n(.*?)```", re.S)


def test_the_page_has_tested_blocks():
    assert len(TESTED.findall(DOC.read_text())) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(TESTED.findall(DOC.read_text()))))
def test_tested_block_runs(index, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed here (make peers-vllm; make test-vllm runs these)")
    script = tmp_path / f"vllm_doc_{index}.py"
    script.write_text(TESTED.findall(DOC.read_text())[index])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
