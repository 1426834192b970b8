"""Quality on real text (issue 58): the metrics, --eval-text's errors, the optimize report's section on the real
model, and a reduce-overhead plan's generate() text equal to eager's on trained weights."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

from superkernel.tools.quality import default_text, read_text, text_quality

from .wf_helpers import error_lines, run_cli


def test_metrics_against_hand_computed_values():
    vocab = 8
    targets = torch.tensor([1, 2, 3])
    uniform = torch.zeros(3, vocab)
    q = text_quality(uniform, targets, uniform)
    assert q.perplexity == pytest.approx(vocab)            # a uniform guess: perplexity = vocabulary size
    assert q.kl_mean == 0 and q.kl_p99 == 0 and q.tokens == 3
    sure = torch.full((3, vocab), -1e4)
    sure[torch.arange(3), targets] = 0.0
    assert text_quality(sure, targets).perplexity == pytest.approx(1.0)
    # KL(uniform || sure) per position = sum 1/8 * (log 1/8 - log p_sure) -> log(8) - mean(log p_sure): huge
    assert text_quality(sure, targets, uniform).kl_mean > 100
    # two distributions with a closed form: p = [1/2, 1/2], q = [3/4, 1/4] -> KL(p||q) = 0.5 ln(2/3) + 0.5 ln 2
    p = torch.log(torch.tensor([[0.5, 0.5]]))
    r = torch.log(torch.tensor([[0.75, 0.25]]))
    q = text_quality(r, torch.tensor([0]), p)
    assert q.kl_mean == pytest.approx(0.5 * math.log(2 / 3) + 0.5 * math.log(2))
    assert q.top1 == 1.0  # argmax of [1/2, 1/2] is 0, as of [3/4, 1/4]


def test_shipped_text_and_eval_text_errors(tmp_path):
    assert len(default_text().split()) > 500
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        read_text(bad)
    good = tmp_path / "text.txt"
    good.write_text("plain words " * 50)
    result = run_cli("optimize", "--model", "llama-tiny", "--eval-text", str(good), "--output", str(tmp_path / "o"),
                     "--quiet")
    lines = [line for line in error_lines(result.err) if line.startswith("superkernel")]
    assert result.code == 2 and len(lines) == 1 and "needs a model with a tokenizer" in lines[0], result.err


DOC = Path(__file__).resolve().parents[2] / "docs" / "real_models.md"


def doc_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block right after a ``<!-- tested -->`` line of docs/real_models.md."""
    return re.findall(r"<!-- tested -->\s*```(\w+)\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.slow
def test_documented_optimize_on_the_real_model_reports_quality(tmp_path, monkeypatch):
    (command,) = [code for lang, code in doc_blocks() if lang == "bash" and "--quantize auto" not in code]
    argv = shlex.split(command)
    assert argv[:2] == ["superkernel", "optimize"]
    monkeypatch.chdir(tmp_path)
    result = run_cli(*argv[1:], "--quiet")
    assert result.code == 0, result.err
    out = tmp_path / argv[argv.index("--output") + 1]
    data = json.loads((out / "results.json").read_text())
    assert data["model_source"]["gguf"]["file_type"] == "Q4_1"
    quality = data["quality"]
    decode = quality["decode"]
    plan = decode["decoder_layer / reduce-overhead"]
    assert plan["kl_mean"] == 0.0 and plan["top1"] == 1.0                    # binary fusion: eager's logits exactly
    assert plan["perplexity"] == decode["eager"]["perplexity"] and plan["tokens"] == 5
    whole = quality["whole_text"]["eager"]
    assert 10 < whole["perplexity"] < 60, whole  # a trained model on plain English (random weights: ~49,000)
    report = next(out.glob("*.md")).read_text()
    assert "## Quality on real text" in report and "eager, whole text" in report


@pytest.mark.slow
def test_documented_generate_keeps_eager_text_on_the_real_model(monkeypatch, capsys):
    """The doc's Python block: reduce-overhead plan, generate() tokens equal to eager's, the answer printed."""
    from tests._doc_module import doc_module

    (code,) = [code for lang, code in doc_blocks() if lang == "python"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    module = doc_module(monkeypatch)
    try:
        with torch.no_grad():
            exec(compile(code, "docs/real_models.md", "exec"), module.__dict__)
    finally:
        torch.set_num_threads(threads)
        from superkernel.tools.generate import remove_for_generate

        if "model" in module.__dict__:
            remove_for_generate(module.model)
    assert "Tokyo" in capsys.readouterr().out
