"""Zoo models and local checkpoint loading."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from superkernel.tools.models import ZOO, ModelLoadError, load_model

from .conftest import ZOO_NAMES


def test_zoo_has_the_three_models_with_several_layers(zoo):
    assert set(ZOO) == set(ZOO_NAMES)
    arch = {name: loaded.architecture for name, loaded in zoo.items()}
    assert arch == {"llama-tiny": "LlamaForCausalLM", "qwen3-moe-tiny": "Qwen3MoeForCausalLM",
                    "deepseek-v3-tiny": "DeepseekV3ForCausalLM"}
    for loaded in zoo.values():
        assert loaded.config.num_hidden_layers >= 4
        assert loaded.num_parameters < 10_000_000  # the demo must fit a 2-core CPU
        assert not loaded.model.training


def test_zoo_weights_are_seeded(llama):
    same = load_model("llama-tiny", seed=0).model.state_dict()
    other = load_model("llama-tiny", seed=1).model.state_dict()
    ref = llama.model.state_dict()
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    assert not torch.equal(ref["model.layers.0.self_attn.q_proj.weight"], other["model.layers.0.self_attn.q_proj.weight"])


def test_deepseek_tiny_has_mla_and_shared_expert(zoo):
    model = zoo["deepseek-v3-tiny"].model
    names = dict(model.named_modules())
    assert "model.layers.1.mlp.shared_experts" in names
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa" in names  # MLA: compressed kv projection
    assert "model.layers.0.mlp.experts" not in names                 # layer 0 stays dense


def test_unknown_model_lists_the_zoo():
    with pytest.raises(ModelLoadError) as err:
        load_model("gpt-17")
    for name in ZOO_NAMES:
        assert name in str(err.value)


def _write_checkpoint(model, path, *, drop=()):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(model.config.to_json_string())
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k not in drop}
    save_file(tensors, str(path / "model.safetensors"))


def test_local_checkpoint_loads_same_weights_and_logits(llama, tmp_path):
    ckpt = tmp_path / "ckpt"
    _write_checkpoint(llama.model, ckpt)
    loaded = load_model(str(ckpt))
    assert loaded.source == "checkpoint" and loaded.architecture == "LlamaForCausalLM"
    ref = llama.model.state_dict()
    got = loaded.model.state_dict()
    assert set(ref) == set(got) and all(torch.equal(ref[k], got[k]) for k in ref)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, llama.model(ids).logits)


def _mapped_files() -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[5] if len(parts) > 5 else ""))
    return out


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_checkpoint_weights_leave_the_file_mapping(llama, tmp_path):
    """transformers leaves safetensors weights mmapped from the file (4 KiB page-cache pages); the
    loader copies them into this process's memory, so eager, torch.compile and a plan's deep copy
    all read the same kind of memory (and huge pages where the CLI set them)."""
    ckpt = tmp_path / "ckpt"
    _write_checkpoint(llama.model, ckpt)
    model = load_model(str(ckpt)).model
    weights = str(ckpt / "model.safetensors")
    maps = _mapped_files()
    in_file = [name for name, p in model.named_parameters()
               if any(a <= p.data_ptr() < b and path == weights for a, b, path in maps)]
    assert in_file == []
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_checkpoint_missing_weights_is_an_error(llama, tmp_path):
    ckpt = tmp_path / "partial"
    _write_checkpoint(llama.model, ckpt, drop=("model.layers.0.mlp.up_proj.weight",))
    with pytest.raises(ModelLoadError, match="lacks 1 weight"):
        load_model(str(ckpt))


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "has no config.json"),
    (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "config.json").write_text(json.dumps({"hidden_size": 4})), "no \"model_type\""),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "llama"})), "no \\*.safetensors"),
])
def test_malformed_checkpoint_dirs(tmp_path, setup, message):
    d = tmp_path / "bad"
    d.mkdir()
    setup(d)
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(d))


def test_pickle_weights_are_named_and_refused(tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="pickle weights are not loaded"):
        load_model(str(d))


def test_missing_dir_and_file_instead_of_dir(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(str(f))


def test_corrupt_safetensors_is_one_clear_error(llama, tmp_path):
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text(llama.model.config.to_json_string())
    (d / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="cannot load checkpoint"):
        load_model(str(d))


def test_cli_analyzes_a_local_checkpoint(zoo, tmp_path):
    import json as _json

    from .wf_helpers import run_cli

    ckpt = tmp_path / "qwen_ckpt"
    _write_checkpoint(zoo["qwen3-moe-tiny"].model, ckpt)
    out = tmp_path / "a.json"
    result = run_cli("analyze", "--model", str(ckpt), "--strategy", "moe", "--prompt-len", "4", "--json", str(out))
    assert result.code == 0, result.err
    data = _json.loads(out.read_text())
    assert data["model"] == str(ckpt) and data["architecture"] == "Qwen3MoeForCausalLM"
    assert [t["strategy"] for t in data["trials"]] == ["moe"] and data["trials"][0]["error"] is None
