"""Bad and unusual inputs of the superkernel command: one clear line, the documented exit code,
checked before any work (issues 10 and 11)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from superkernel.tools.models import ModelLoadError, load_model
from superkernel.tools.models.archs import save_checkpoint

from .wf_helpers import error_lines, run_cli


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return save_checkpoint("llama", tmp_path_factory.mktemp("ckpt") / "llama")


def _one_error(result, code, *needles):
    lines = [line for line in error_lines(result.err) if line.startswith("superkernel")]  # not progress bars
    assert result.code == code, result.err
    assert len(lines) == 1 and lines[0].startswith("superkernel") and " error: " in lines[0], lines
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_output_that_is_an_existing_file_is_refused_before_loading(tmp_path, monkeypatch):
    from superkernel.tools.advisor import workflow

    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    target = tmp_path / "file"
    target.write_text("x")
    _one_error(run_cli("optimize", "--output", str(target), "--quiet"), 2, "--output", "existing file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_output_is_refused_before_loading(tmp_path, monkeypatch):
    from superkernel.tools.advisor import workflow

    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _one_error(run_cli("optimize", "--output", str(locked / "out"), "--quiet"), 2, "--output", "not writable")
    finally:
        locked.chmod(0o700)


def test_analyze_unknown_strategy_is_rejected_before_loading(monkeypatch):
    from superkernel.tools.advisor import workflow

    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    _one_error(run_cli("analyze", "--strategy", "nosuch"), 2, "unknown strategy 'nosuch'", "attention")


def test_analyze_json_in_a_missing_place_is_refused_before_loading(tmp_path, monkeypatch):
    from superkernel.tools.advisor import workflow

    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    _one_error(run_cli("analyze", "--json", str(tmp_path)), 2, "--json", "is a directory")


@pytest.mark.parametrize("flag", ["--threads", "--batch-size", "--steps", "--warmup"])
@pytest.mark.parametrize("value", ["-1", "0", "x"])
def test_counts_must_be_positive(flag, value, tmp_path):
    _one_error(run_cli("optimize", flag, value, "--output", str(tmp_path)), 2, flag)


def test_unknown_dtype_is_rejected(tmp_path):
    _one_error(run_cli("optimize", "--dtype", "int7", "--output", str(tmp_path)), 2, "--dtype", "bfloat16")


def test_checkpoint_dtype_is_the_default_and_dtype_overrides(tmp_path):
    ckpt = save_checkpoint("llama", tmp_path / "bf16", dtype=torch.bfloat16)
    loaded = load_model(str(ckpt))
    assert next(loaded.model.parameters()).dtype == torch.bfloat16 and loaded.dtype_source == "checkpoint"
    loaded = load_model(str(ckpt), dtype="float32")
    assert next(loaded.model.parameters()).dtype == torch.float32 and loaded.dtype_source == "--dtype"
    assert next(load_model("llama-tiny").model.parameters()).dtype == torch.float32


def test_auto_map_checkpoint_is_refused_and_its_code_never_runs(tiny_ckpt, tmp_path):
    import shutil

    ckpt = tmp_path / "remote"
    shutil.copytree(tiny_ckpt, ckpt)
    marker = tmp_path / "PWNED"
    (ckpt / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="trust_remote_code=False"):
        load_model(str(ckpt))
    _one_error(run_cli("analyze", "--model", str(ckpt)), 2, "auto_map", "never runs code")
    assert not marker.exists()


def test_zero_layers_is_a_clear_error(tmp_path):
    ckpt = save_checkpoint("llama", tmp_path / "zero", num_hidden_layers=0)
    _one_error(run_cli("analyze", "--model", str(ckpt)), 1, "0 decoder layers")


def test_linear_attention_only_is_a_clear_error(tmp_path):
    ckpt = save_checkpoint("qwen3_next", tmp_path / "linear", layer_types=["linear_attention", "linear_attention"])
    _one_error(run_cli("analyze", "--model", str(ckpt)), 1, "linear attention", "at least one attention layer")


def test_batch_size_two_decodes_two_sequences(tiny_ckpt):
    from superkernel.tools.decode import prepare, run_decode

    model = load_model(str(tiny_ckpt)).model
    session = prepare(model, prompt_len=6, steps=2, warmup=1, batch=2)
    assert session.prompt_ids.shape == (2, 6) and session.tokens.shape == (3, 2)
    assert not torch.equal(session.prompt_ids[0], session.prompt_ids[1])
    run = run_decode(session, session.step_fn())
    assert run.logits.shape == (3 * 2, 256) and run.batch == 2
    assert torch.equal(run.logits.argmax(-1).reshape(3, 2)[:-1], session.tokens[1:].cpu())
    assert run.tokens_per_s == pytest.approx(2 * 1000 / run.median_ms)
