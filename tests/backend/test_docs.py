"""Every ```python block of README.md, docs/api.md and docs/quantization.md runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests._doc_module import doc_module

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text()
    return [(f"{name}#{i}", code) for i, code in enumerate(BLOCK.findall(text))]


CASES = blocks("README.md") + blocks("docs/api.md") + blocks("docs/quantization.md")


@pytest.mark.parametrize("name, code", CASES, ids=[c[0] for c in CASES])
def test_doc_example_runs(name, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    exec(compile(code, name, "exec"), doc_module(monkeypatch).__dict__)


def test_there_are_examples():
    assert len(CASES) >= 5
