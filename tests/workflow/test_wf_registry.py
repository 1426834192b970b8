"""The generated architecture sweep: transformers' own registry, tiny configs, eligibility in eager,
and its CI subset through the analyze / optimize harness (benchmarks/hf_registry_sweep.py runs all).

The CI subset is one model per failure class the issue found on architectures nobody on the
project wrote: a recurrent state cache (Mamba), a position bias sliced with an index computed
from a tensor (MPT: capturing it made Dynamo fail), learned absolute positions with an offset
and a growing mask (BioGPT: it recompiled in the timed steps); and two the full sweep found
after those were fixed: a default mask built from the cache's length (RemBERT, as BigBird,
Megatron-BERT and RoFormer: the reference compile failed) and decoder layers kept as parallel
ModuleLists (XLM: decoder_layer found no stack; its structure is tested here, its decode is not
possible on a static cache once the harness passes XLM's `cache` keyword), then decode state
kept on the modules outside the cache (RecurrentGemma).
"""

from __future__ import annotations

import pytest
import torch

from superkernel.tools.models.eligibility import probe
from superkernel.tools.models.registry import CI_SUBSET, build_tiny, causal_lm_types, tiny_config
from superkernel.tools.models.sweep import sweep_one


def test_the_list_is_transformers_registry_not_a_hand_list():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = causal_lm_types()
    assert types == sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t in CONFIG_MAPPING_NAMES)
    assert {"llama", "mamba", "mpt", "biogpt", "rwkv", "bart"} <= set(types)


@pytest.mark.parametrize("model_type", ["mpt", "mamba", "biogpt", "olmo_hybrid", "gpt_bigcode"])
def test_generated_tiny_configs_are_tiny(model_type):
    config = tiny_config(model_type)
    text = config.get_text_config()
    hidden = getattr(text, "hidden_size", None) or getattr(text, "d_model", None) or getattr(text, "n_embd")
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layers", None) or getattr(text, "n_layer")
    assert hidden == 64 and text.vocab_size == 256
    assert 2 <= layers <= 4
    if getattr(text, "layer_types", None):  # hybrid stacks keep one layer of every kind
        from transformers import AutoConfig

        assert set(text.layer_types) == set(AutoConfig.for_model(model_type).get_text_config().layer_types)


def test_an_architecture_eager_cannot_decode_is_listed_with_the_reason():
    row = probe("minimax")  # MiniMax brings its own cache class and rejects a StaticCache
    assert row["eligible"] is False and row["stage"] == "prefill"
    assert "StaticCache" in row["reason"] and "modeling_minimax.py:" in row["reason"]


@pytest.mark.parametrize("model_type", CI_SUBSET)
def test_ci_subset_is_bit_exact_and_compiles_once(model_type):
    row = sweep_one(model_type)
    assert row["eligible"] and row.get("exit") == 0, row.get("reason")
    assert row["bit_exact"] is True
    assert row["recompiles_timed"] == 0 and not row["limit_hit"], row["recompile_reasons"]
    assert row["segments"] >= 1
    if model_type == "mpt":  # the data-dependent slice fell back to a graph break, named with its source line
        assert row["capture_fallbacks"] and "modeling_mpt.py:" in row["capture_fallbacks"][0]
        assert row["graph_breaks"] >= 1
    torch._dynamo.reset()


@pytest.mark.parametrize("model_type, scheme", [("biogpt", "w8a8"), ("rembert", "int8-weight")])
def test_ci_subset_quantized_is_bit_exact_to_its_reference(model_type, scheme):
    """Quantized models of the CI subset (two here, to keep the suite short; benchmarks/hf_registry_sweep.py
    --quantize runs every scheme on the whole subset): reduce-overhead bit-exact to its exactness reference,
    the quantized eager model's greedy tokens reported."""
    pytest.importorskip("torchao")
    row = sweep_one(model_type, quantize=scheme)
    assert row.get("exit") == 0, row.get("reason")
    assert row["quantization"]["layers"] > 0 and row["bit_exact"] is True
    assert row["recompiles_timed"] == 0 and 0 <= row["greedy_agreement_vs_eager"] <= 1
    torch._dynamo.reset()


def test_strict_scope_check_abort_raises_instead_of_falling_back():
    import superkernel
    from superkernel.ir.graph import SuperKernelScopeError
    from superkernel.tools.advisor.compiling import compile_superkernel
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models.registry import build_tiny

    model = build_tiny("mpt")
    session = prepare(model, prompt_len=20, steps=1, warmup=1)
    superkernel.apply_scopes(model, plan_for("decoder_layer", analyze_structure(model)).scopes,
                             options="strict-scope-check=abort")
    try:
        step, _ = compile_superkernel(session, "reduce-overhead")
        with pytest.raises(SuperKernelScopeError, match=r"strict-scope-check=abort.*modeling_mpt\.py:\d+"):
            run_decode(session, step)
    finally:
        superkernel.remove_scopes(model)
        torch._dynamo.reset()


def test_a_default_mask_that_grows_is_replaced_by_a_full_length_one(llama_session):
    """RemBERT builds ``torch.ones(batch, past + 1)`` from the cache's length when no mask is given:
    compiled, its size is data-dependent (the reference compile failed with an IndexError). The
    harness detects the growing mask in eager and passes one as long as the cache, as generate() does."""
    from superkernel.tools.decode import prepare
    from superkernel.tools.default_mask import default_mask_grows
    from superkernel.tools.models.registry import build_tiny

    session = prepare(build_tiny("rembert"), prompt_len=20, steps=2, warmup=1)
    assert session.attention_mask is not None
    assert tuple(session.attention_mask.shape) == (1, session.max_cache_len) and bool(session.attention_mask.all())
    mask, session.attention_mask = session.attention_mask, None
    session.restore_cache()
    assert default_mask_grows(session.step_fn(), [session.inputs(0), session.inputs(1)], session.batch)
    session.attention_mask = mask
    session.restore_cache()
    assert not default_mask_grows(session.step_fn(), [session.inputs(0), session.inputs(1)], session.batch)
    session.restore_cache()
    assert llama_session.attention_mask is None  # llama builds no mask of its own from the cache length


def test_layers_kept_as_parallel_lists_get_one_scope_per_layer():
    """XLM has no module per decoder layer: entry i of ``attentions`` / ``layer_norm1`` / ``ffns`` /
    ``layer_norm2`` is layer i. decoder_layer gives each layer's label to its entries."""
    import superkernel
    from superkernel.tools.advisor.strategies import applicable, plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.models.registry import build_tiny

    model = build_tiny("xlm")
    structure = analyze_structure(model)
    lists = ["transformer.attentions", "transformer.layer_norm1", "transformer.ffns", "transformer.layer_norm2"]
    assert not structure.layers and structure.parallel_lists == lists
    assert applicable(structure)["decoder_layer"] is None and applicable(structure)["attention"] is not None
    plan = plan_for("decoder_layer", structure)
    assert plan.scopes == {f"decoder_layer_{i}": [f"{p}.{i}" for p in lists] for i in range(2)}
    assert plan_for("all_layers", structure).scopes == {"all_layers": [f"{p}.*" for p in lists]}
    try:
        assert len(superkernel.apply_scopes(model, plan.scopes)) == 8
    finally:
        superkernel.remove_scopes(model)
    assert structure.stack_description == f"2 as parallel lists {', '.join(lists)}"


@pytest.mark.parametrize("model_type", ["inkling2_text", "dory"])
def test_new_registry_entries_build_a_consistent_tiny_model(model_type):
    """transformers 5.24: Inkling2's LM head is ``unpadded_vocab_size`` wide (200058 by default: its
    greedy tokens fell outside the tiny embedding), Dory serializes its layers as (attention, mlp) pairs
    (the generic shrink's layer list did not match the count). Both now build and emit tiny logits."""
    if model_type not in causal_lm_types():
        pytest.skip(f"{model_type} is not registered in this transformers")
    model = build_tiny(model_type)
    vocab = model.config.get_text_config().vocab_size
    with torch.no_grad():
        logits = model(input_ids=torch.arange(6)[None] % vocab).logits
    assert vocab == 256 and logits.shape[-1] <= vocab
