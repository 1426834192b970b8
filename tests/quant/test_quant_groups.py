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


def test_a_gguf_file_of_4bit_blocks_of_32_is_requantized_on_its_own_grid():
    row = SCHEMES["int4-weight"]
    smollm2 = {"a": 576, "b": 1536}
    assert choose(row, smollm2, None, "Q4_1") == (32, "chosen: the GGUF file's Q4_1 blocks of 32 (int4 on the "
                                                      "file's own grid)")
    assert choose(row, smollm2, None, "Q4_K_M")[0] == 32
    assert choose(row, smollm2, None, "F16")[0] == 64  # no 4-bit grid: the largest size that fits
    assert choose(row, smollm2, 64, "Q4_1") == (64, "given")
    assert choose(row, {"a": 896}, None, "Q8_0")[0] == 128
    assert choose(SCHEMES["w4a8"], smollm2, None, "Q4_1")[1].startswith("chosen: the scheme's block of 32")


def _head_model():
    pytest.importorskip("torchao")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1,
                         num_attention_heads=3, num_key_value_heads=1, head_dim=32, vocab_size=256,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("scheme", ["int4-weight", "w4a8"])
def test_a_4bit_schemes_output_head_is_int8_and_a_tied_embedding_stays_float(scheme):
    from superkernel.tools.quantize import describe_cost, quantize_model

    model = _head_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    embedding = model.model.embed_tokens.weight.detach().clone()
    info = quantize_model(model, scheme)
    assert type(model.lm_head.weight).__name__ == "Int8Tensor" and info.head == "lm_head: int8-weight"
    assert type(model.model.layers[0].mlp.down_proj.weight).__name__ != "Int8Tensor"
    assert type(model.model.embed_tokens.weight) is torch.nn.Parameter
    assert torch.equal(model.model.embed_tokens.weight, embedding)
    assert info.layers == 7 + 1 and info.plan_entry == {"scheme": scheme, "group_size": 32}
    assert "(output head lm_head: int8-weight)" in describe_cost(info.to_dict())
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_the_head_can_be_kept_float_or_in_the_schemes_own_4bits_and_a_plan_says_so():
    from superkernel.tools.advisor.plan_file import PlanFileError, quantize_for_plan, read_plan
    from superkernel.tools.quantize import QuantizationError, quantize_model

    model = _head_model()
    info = quantize_model(model, "int4-weight", head="float")
    assert model.lm_head.weight is model.model.embed_tokens.weight and info.layers == 7
    assert info.plan_entry == {"scheme": "int4-weight", "group_size": 32, "head": "float"}
    model = _head_model()
    info = quantize_model(model, "int4-weight", head="int4-weight")
    assert type(model.lm_head.weight).__name__ == "Int4OpaqueTensor" and info.plan_entry["head"] == "int4-weight"
    assert quantize_model(_head_model(), "int8-weight").plan_entry == {"scheme": "int8-weight"}
    with pytest.raises(QuantizationError, match=r"head quantization 'w4a8' is not allowed with int4-weight; allowed: "
                                                r"int4-weight, int8-weight, w8a8, float"):
        quantize_model(_head_model(), "int4-weight", head="w4a8")
    base = {"mode": "reduce-overhead", "scopes": {"a": "model.layers.*"}}
    plan = read_plan({**base, "quantization": {"scheme": "w4a8", "head": "float"}})
    model = _head_model()
    assert quantize_for_plan(model, plan)["head"] == "lm_head: float"
    assert type(model.lm_head.weight) is torch.nn.Parameter
    with pytest.raises(PlanFileError, match="head quantization 'int4-weight' is not allowed with int8-weight"):
        read_plan({**base, "quantization": {"scheme": "int8-weight", "head": "int4-weight"}})
