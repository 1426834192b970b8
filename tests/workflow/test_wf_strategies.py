"""Structure detection and scope strategies hit the right modules."""

from __future__ import annotations

import pytest

import superkernel
from superkernel.tools.advisor.strategies import (StrategyError, auto_plans, compress, custom_plan, parse_scope_args,
                                            parse_strategy, plan_for, select_plans)
from superkernel.tools.advisor.structure import analyze_structure


def _wrapped(model, strategy):
    plan = plan_for(strategy, analyze_structure(model))
    try:
        return plan, sorted(superkernel.apply_scopes(model, plan.scopes)), superkernel.scope_apply.scoped_modules(model)
    finally:
        superkernel.remove_scopes(model)


def test_structure_of_each_zoo_model(zoo):
    llama = analyze_structure(zoo["llama-tiny"].model)
    assert (llama.layers_path, llama.num_layers, llama.attention_kind) == ("model.layers", 4, "GQA")
    assert llama.mlp_paths == [f"model.layers.{i}.mlp" for i in range(4)] and not llama.is_moe
    qwen = analyze_structure(zoo["qwen3-moe-tiny"].model)
    assert qwen.moe_paths == [f"model.layers.{i}.mlp" for i in range(4)] and not qwen.mlp_paths
    assert qwen.layers[0].router == "model.layers.0.mlp.gate" and qwen.layers[0].num_experts == 8
    ds = analyze_structure(zoo["deepseek-v3-tiny"].model)
    assert ds.attention_kind == "MLA"
    assert ds.mlp_paths == ["model.layers.0.mlp"]
    assert ds.moe_paths == [f"model.layers.{i}.mlp" for i in (1, 2, 3)]
    assert ds.layers[1].shared_experts == "model.layers.1.mlp.shared_experts"
    assert ds.layers[1].experts == "model.layers.1.mlp.experts"
    assert len(ds.layers[0].norms) == 2


@pytest.mark.parametrize("model_name, strategy, expected", [
    ("llama-tiny", "attention", [f"model.layers.{i}.self_attn" for i in range(4)]),
    ("llama-tiny", "mlp", [f"model.layers.{i}.mlp" for i in range(4)]),
    ("qwen3-moe-tiny", "moe", [f"model.layers.{i}.mlp" for i in range(4)]),
    ("deepseek-v3-tiny", "moe", [f"model.layers.{i}.mlp" for i in (1, 2, 3)]),
    ("deepseek-v3-tiny", "mlp", ["model.layers.0.mlp"]),
    ("deepseek-v3-tiny", "all_layers", [f"model.layers.{i}" for i in range(4)]),
])
def test_strategy_wraps_exactly_the_expected_modules(zoo, model_name, strategy, expected):
    model = zoo[model_name].model
    _, wrapped, labels = _wrapped(model, strategy)
    assert wrapped == sorted(expected)
    assert set(labels.values()) == {strategy}
    assert superkernel.scope_apply.scoped_modules(model) == {}  # removed again


def test_decoder_layer_gives_one_scope_per_layer(zoo):
    plan, wrapped, labels = _wrapped(zoo["qwen3-moe-tiny"].model, "decoder_layer")
    assert labels == {f"model.layers.{i}": f"decoder_layer_{i}" for i in range(4)}
    assert len(plan.scopes) == 4


def test_all_layers_is_one_label_over_the_stack(llama):
    plan, wrapped, labels = _wrapped(llama.model, "all_layers")
    assert plan.scopes == {"all_layers": ["model.layers.*"]}
    assert set(labels.values()) == {"all_layers"} and len(labels) == 4


def test_auto_is_bottom_up_and_only_applicable(zoo):
    assert [p.strategy for p in auto_plans(analyze_structure(zoo["llama-tiny"].model))] == \
        ["attention", "mlp", "decoder_layer", "all_layers"]
    assert [p.strategy for p in auto_plans(analyze_structure(zoo["qwen3-moe-tiny"].model))] == \
        ["attention", "moe", "decoder_layer", "all_layers"]
    assert [p.strategy for p in auto_plans(analyze_structure(zoo["deepseek-v3-tiny"].model))] == \
        ["attention", "mlp", "moe", "decoder_layer", "all_layers"]


def test_inapplicable_and_unknown_strategies(zoo):
    structure = analyze_structure(zoo["qwen3-moe-tiny"].model)
    with pytest.raises(StrategyError, match="does not apply.*no dense MLP"):
        plan_for("mlp", structure)
    with pytest.raises(StrategyError, match="choose one of: attention, mlp, moe, decoder_layer, all_layers, custom, auto"):
        plan_for("everything", structure)
    with pytest.raises(StrategyError, match="does not apply.*no MoE"):
        plan_for("moe", analyze_structure(zoo["llama-tiny"].model))


@pytest.mark.parametrize("strategy, search, policy, every_plan, retimed", [
    ("auto", None, "predicted", False, True),
    ("auto", "all", "all", True, True),
    ("auto", "exhaustive", "exhaustive", True, False),
    ("attention", None, "all", True, True),
    ("attention", "exhaustive", "exhaustive", True, False),
])
def test_the_search_policy_is_explicit(strategy, search, policy, every_plan, retimed):
    choice = parse_strategy(strategy, search)
    assert (choice.search, choice.every_plan, choice.retimed) == (policy, every_plan, retimed)


def test_parse_strategy_refuses_what_does_not_go_together():
    with pytest.raises(StrategyError, match="unknown strategy 'fastest'; choose one of: attention, mlp, moe"):
        parse_strategy("fastest")
    with pytest.raises(StrategyError, match="unknown search 'quick'; choose one of: predicted, all, exhaustive"):
        parse_strategy("auto", "quick")
    with pytest.raises(StrategyError, match="--strategy mlp is one plan: use --search all or exhaustive"):
        parse_strategy("mlp", "predicted")
    with pytest.raises(StrategyError, match="add --strategy custom"):
        parse_strategy("auto", custom_scopes={"a": ["model.layers.*"]})
    with pytest.raises(StrategyError, match="needs scopes"):
        parse_strategy("custom")


def test_select_plans_of_a_choice(zoo):
    structure = analyze_structure(zoo["llama-tiny"].model)
    assert [p.strategy for p in select_plans(parse_strategy("auto"), structure)] == \
        [p.strategy for p in auto_plans(structure)]
    assert select_plans(parse_strategy("custom", custom_scopes={"a": "model.layers.0"}), structure)[0].scopes == \
        {"a": ["model.layers.0"]}
    assert select_plans(parse_strategy("mlp"), structure) == [plan_for("mlp", structure)]
    with pytest.raises(StrategyError, match="'auto' is not one plan"):
        plan_for("auto", structure)


def test_compress_only_when_every_layer_matches():
    paths = [f"m.layers.{i}.attn" for i in range(3)]
    assert compress(paths, "m.layers", 3) == ["m.layers.*.attn"]
    assert compress(paths[:2], "m.layers", 3) == paths[:2]
    assert compress(["m.layers.0.a", "m.layers.1.b"], "m.layers", 2) == ["m.layers.0.a", "m.layers.1.b"]


def test_custom_scopes_from_args_and_mapping(llama):
    scopes = parse_scope_args(["attn=model.layers.*.self_attn", "ffn=model.layers.0.mlp,model.layers.1.mlp"])
    assert scopes == {"attn": ["model.layers.*.self_attn"], "ffn": ["model.layers.0.mlp", "model.layers.1.mlp"]}
    plan = custom_plan(scopes)
    try:
        assert len(superkernel.apply_scopes(llama.model, plan.scopes)) == 6
    finally:
        superkernel.remove_scopes(llama.model)
    for bad in (["noequals"], ["=glob"], ["label="]):
        with pytest.raises(StrategyError, match="LABEL=GLOB"):
            parse_scope_args(bad)
    with pytest.raises(StrategyError, match="needs scopes"):
        custom_plan({})
    with pytest.raises(StrategyError, match="module glob or a list"):
        custom_plan({"x": 3})
