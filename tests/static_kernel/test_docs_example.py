"""The Python example of docs/static_kernel.md runs as a script, and does what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import fresh_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "static_kernel.md"


def test_static_kernel_doc_example_runs(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    script = tmp_path / "example.py"
    script.write_text(code)
    # the fresh-process load check of the package is covered elsewhere
    env = fresh_env(tmp_path, SUPERKERNEL_STATIC_VERIFY="0")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "1 partitions compiled, 1 frame built", proc.stderr[-3000:]
    assert "static kernels" not in proc.stderr  # no warning, no notice
