"""The scheme table is what every part reads, and int4's group size divides every layer it quantizes: chosen for
the user, or the user's own refused in one line with the sizes that fit (never layers silently left float)."""

from __future__ import annotations

import json

import pytest
import torch

from superkernel.runtime.quant_schemes import SCHEMES, kernels
from superkernel.tools.quant_groups import GroupSizeError, choose

#: a llama whose widths are like SmolLM2-135M's (576 / 1536): 96 and 160 take 32, not 64 or 128
HIDDEN, INTERMEDIATE = 96, 160


def test_every_scheme_row_names_its_config_kernels_and_rewrite():
    assert list(SCHEMES) == ["int8-weight", "w8a8", "int4-weight", "w4a8"]
    for row in SCHEMES.values():
        assert row.kernels and row.report_name and row.summary
        assert callable(row.rewriter()) and row.config.startswith("torchao.")
    assert {k.op for k in kernels()} == {"int8_gemv", "int8_weight_gemv", "int4_weight_gemv", "int4_int8_gemv"}
    assert [r.name for r in SCHEMES.values() if r.rounds_activations] == ["w8a8", "w4a8"]


def test_the_group_choice_takes_the_largest_size_dividing_every_width():
    row = SCHEMES["int4-weight"]
    assert choose(row, {"a": 576, "b": 1536}, None)[0] == 64  # SmolLM2-135M
    assert choose(row, {"a": 896, "b": 4864}, None)[0] == 128  # Qwen2-0.5B
    assert choose(row, {"a": HIDDEN, "b": INTERMEDIATE}, None) == (
        32, "chosen: the largest of 128, 64, 32 dividing every input width (96, 160)")
    assert choose(row, {"a": 576}, 32) == (32, "given")
    assert choose(SCHEMES["w4a8"], {"a": 576}, None) == (32, "chosen: the scheme's block of 32 divides every input "
                                                            "width (576)")
    with pytest.raises(GroupSizeError, match=r"no group size of 32, 64, 128, 256 divides every layer's input width "
                                             r"\(not even 32: 100 \(a\)\)"):
        choose(row, {"a": 100, "b": 128}, None)


def test_a_group_size_that_leaves_a_layer_is_refused_with_the_widths_and_the_sizes_that_fit():
    row = SCHEMES["int4-weight"]
    widths = {f"layers.{i}.q": 576 for i in range(3)} | {"layers.0.down": 1536}
    with pytest.raises(GroupSizeError) as err:
        choose(row, widths, 128)
    assert str(err.value) == ("int4-weight: group size 128 does not divide the input width of every layer it "
                              "quantizes (576 (layers.0.q and 2 more); all input widths: 576, 1536); group sizes "
                              "that fit every layer: 64, 32")


def _llama(tmp_path=None):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=2,
                         num_attention_heads=3, num_key_value_heads=1, head_dim=32, vocab_size=256,
                         max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    if tmp_path is not None:
        model.save_pretrained(tmp_path, safe_serialization=True)
    return model


def test_int4_quantizes_every_linear_of_a_model_whose_widths_128_does_not_divide():
    pytest.importorskip("torchao")
    from superkernel.tools.quantize import describe_cost, quantize_model

    model = _llama()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    info = quantize_model(model, "int4-weight")
    subclassed = [m for m in linears if type(m.weight) is not torch.nn.Parameter and hasattr(m.weight, "qdata")]
    assert len(subclassed) == len(linears) == info.layers == 2 * 7 + 1 and info.skipped == []
    assert info.group_size == 32 and info.group_choice.startswith("chosen")
    assert info.plan_entry == {"scheme": "int4-weight", "group_size": 32}
    assert describe_cost(info.to_dict()).startswith("int4-weight (group 32, chosen for the layer widths) with torchao")
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_a_group_size_that_does_not_divide_is_refused_before_any_layer_is_touched():
    pytest.importorskip("torchao")
    from superkernel.tools.quantize import QuantizationError, is_quantized, quantize_model

    model = _llama()
    with pytest.raises(QuantizationError, match=r"^int4-weight: group size 64 does not divide .*96 \(model\.layers"
                                                r".*160 \(model\.layers.*group sizes that fit every layer: 32$"):
        quantize_model(model, "int4-weight", group_size=64)
    assert not is_quantized(model)


def test_the_cli_refuses_a_group_size_that_does_not_divide_in_one_line_with_exit_2(tmp_path, capsys):
    pytest.importorskip("torchao")
    from superkernel.tools.cli import main

    _llama(tmp_path / "model")
    capsys.readouterr()  # (the checkpoint writer's progress bar)
    code = main(["optimize", "--model", str(tmp_path / "model"), "--quantize", "int4-weight", "--group-size", "128",
                 "--strategy", "all_layers", "--mode", "reduce-overhead", "--steps", "2", "--warmup", "1",
                 "--quiet", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "group size 128 does not divide" in err and "group sizes that fit every layer: 32" in err, err
    assert not (tmp_path / "out" / "superkernel.yaml").exists()


def test_a_plans_group_size_is_the_one_chosen(tmp_path):
    """A plan without a group size quantizes with the one chosen; a plan's bad one is refused, not half-applied."""
    pytest.importorskip("torchao")
    from superkernel.tools.advisor.plan_file import quantize_for_plan, read_plan
    from superkernel.tools.quantize import QuantizationError

    base = {"mode": "reduce-overhead", "scopes": {"a": "model.layers.*"}}
    done = quantize_for_plan(_llama(), read_plan({**base, "quantization": {"scheme": "int4-weight"}}))
    assert done["group_size"] == 32 and done["layers"] == 15
    json.dumps(done)  # a results entry
    with pytest.raises(QuantizationError, match="group sizes that fit every layer: 32"):
        quantize_for_plan(_llama(), read_plan({**base, "quantization": {"scheme": "int4-weight", "group_size": 128}}))
