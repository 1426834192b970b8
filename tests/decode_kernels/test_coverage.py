"""What the decode kernel set covers and the one warning where it does not (runtime/cuda/decode_kernels/coverage.py,
hookup.install's fallback, apply_for_generate's compiler_config). Decisions only: no Triton needed, these run in
``make test`` (where Triton is absent, a covered model's one reason left is exactly that)."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed here")

from superkernel.runtime.cuda.decode_kernels import coverage, hookup, triton_available  # noqa: E402

TRITON = triton_available()


def tiny(model_cls="LlamaForCausalLM", config_cls="LlamaConfig", dtype=torch.bfloat16, **overrides):
    values = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=64)
    values.update(overrides)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**values)).eval()
    return model.to(dtype)


def config(mode="max-autotune", on=True):
    import superkernel as sk

    cfg = sk.CompilerConfig()
    cfg.mode = mode
    cfg.experimental_config.cuda_decode_kernels = on
    return cfg


def reason(model, mode="max-autotune", device="cuda"):
    return coverage.model_reason(model, mode=mode, device=device)


def test_a_bfloat16_llama_is_covered_on_cuda_in_max_autotune():
    assert reason(tiny()) == (None if TRITON else "Triton is not importable in this process")


@pytest.mark.parametrize("case,want", [
    (dict(mode="reduce-overhead"), "the kernel set is part of max-autotune, and the plan's mode is reduce-overhead"),
    (dict(device="cpu"), "the kernel set runs on CUDA (Triton); the model is on cpu"),
])
def test_mode_and_device(case, want, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert reason(tiny(), **case) == want


def test_the_cpu_counts_only_under_tritons_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert reason(tiny(), device="cpu") == (None if TRITON else "Triton is not importable in this process")


_NOT_COVERED = [
    (lambda: tiny(dtype=torch.float32), "layer 0: weights in float32: the set runs bfloat16 weights or int8"),
    (lambda: tiny(dtype=torch.float16), "layer 0: weights in float16"),
    (lambda: tiny(attention_bias=True), "layer 0: projections with a bias (self_attn.q_proj, self_attn.k_proj"),
    (lambda: tiny(mlp_bias=True), "layer 0: projections with a bias (mlp.gate_proj"),
    (lambda: tiny(hidden_act="gelu"), "MLP activation 'gelu'"),
    (lambda: _configured(tiny(), head_dim=15), "head_dim 15 is odd"),  # (transformers refuses it at build)
    (lambda: _configured(tiny(), pretraining_tp=2), "pretraining_tp=2"),
    (lambda: tiny("Qwen2ForCausalLM", "Qwen2Config"), "model type 'qwen2': the set covers Llama-style decoders"),
    (lambda: tiny("MistralForCausalLM", "MistralConfig"), "model type 'mistral'"),
]


def _configured(model, **values):
    for k, v in values.items():
        setattr(model.config, k, v)
    return model


@pytest.mark.parametrize("build,want", _NOT_COVERED)
def test_what_is_not_covered_is_named(build, want):
    got = reason(build())
    assert got is not None and got.startswith(want), got


def test_int8_weight_only_is_covered_and_mixed_kinds_are_not():
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = tiny()
    quantize_(model.model.layers, Int8WeightOnlyConfig())
    assert coverage.layer_reason(model.model.layers[0]) is None
    assert coverage._weight_kind(model.model.layers[0].mlp.up_proj.weight) == "int8-weight"
    mixed = tiny()
    quantize_(mixed.model.layers[1].mlp, Int8WeightOnlyConfig())
    assert reason(mixed).startswith("layer 1: projections of mixed kinds (bfloat16, int8-weight)")
    del torchao


class _Layer:  # a cache layer's attributes that step_reason reads (not a StaticLayer by name)
    def __init__(self, batch=1, dtype=torch.bfloat16, initialized=True, position=True):
        self.is_initialized = initialized
        self.keys = torch.zeros(batch, 2, 16, 16, dtype=dtype) if initialized else None
        if position:
            self.cumulative_length = torch.tensor([3])


class StaticLayer(_Layer):
    pass


class _Cache:
    def __init__(self, layer):
        self.layers = [layer]


def _step(tokens=1, batch=1, dtype=torch.bfloat16, cache=None, cos_sin=True, cache_position=None):
    x = torch.zeros(batch, tokens, 64, dtype=dtype)
    cache = cache if cache is not None else _Cache(StaticLayer())
    pe = (torch.ones(1, 1, 16), torch.zeros(1, 1, 16)) if cos_sin else None
    return coverage.step_reason(x, cache, 0, pe, cache_position)


def test_step_reasons():
    assert _step() is None
    assert _step(tokens=5) == coverage.NOT_A_DECODE_STEP
    assert _step(batch=2) == "batch 2: the set decodes batch 1"
    assert _step(dtype=torch.float32) == "activations in torch.float32: the set runs bfloat16"
    assert _step(cache=_Cache(_Layer())).startswith("a _Layer cache: the set writes K and V into a StaticCache")
    assert _step(cache=_Cache(StaticLayer(initialized=False))).startswith("the static cache is not initialized")
    assert _step(cache=_Cache(StaticLayer(batch=2))).startswith("a static cache of batch 2")
    assert _step(cos_sin=False).startswith("no rotary cos/sin")
    assert _step(cache=object()).startswith("no cache layer 0")
    # an older transformers hands the layers cache_position instead of keeping cumulative_length
    no_position = _Cache(StaticLayer(position=False))
    assert _step(cache=no_position).startswith("no device-side write position")
    assert _step(cache=no_position, cache_position=torch.tensor([3])) is None
    assert coverage.position_source(no_position.layers[0], torch.tensor([3])) == "cache_position"


def test_a_real_static_cache_layer_is_what_step_reason_takes():
    """The class name and attributes step_reason reads are transformers' StaticLayer's (this release's)."""
    from transformers import StaticCache

    model = tiny()
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    pe = model.model.rotary_emb(x, torch.tensor([[3]]))
    assert coverage.step_reason(x, cache, 1, pe) is None
    assert coverage.position_source(cache.layers[1], None) == "cumulative_length"


def test_install_with_the_flag_off_does_nothing_silently():
    model = tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hookup.install(model, config(on=False)) is None
    assert hookup.hookup_of(model) is None and "forward" not in vars(model.model.layers[0])


def test_an_uncovered_model_warns_once_with_the_reason_and_is_left_as_it_was(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny(dtype=torch.float32)
    with pytest.warns(UserWarning) as record:
        assert hookup.install(model, config(), device="cuda") is None
    messages = [str(w.message) for w in record if "cuda_decode_kernels" in str(w.message)]
    assert messages == ["experimental_config.cuda_decode_kernels: LlamaForCausalLM decodes with Inductor's kernels: "
                        "layer 0: weights in float32: the set runs bfloat16 weights or int8 weight-only (bfloat16 "
                        "activations)"]
    assert hookup.hookup_of(model) is None and "forward" not in vars(model.model.layers[0])
    assert not any(n.startswith("_sk_dk_") for n, _ in model.named_buffers())


def test_apply_for_generate_passes_its_compiler_config_to_the_hookup(monkeypatch):
    """A plan on a CPU model with the flag on: the hookup declines (CPU, no interpreter) with its one warning, and
    the plan is applied as without it."""
    import superkernel
    from superkernel.tools.generate import remove_for_generate

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny()
    with pytest.warns(UserWarning) as record:
        superkernel.apply_for_generate(model, "decoder_layer", mode="max-autotune", compiler_config=config())
    hooked = [str(w.message) for w in record if "decodes with Inductor's kernels" in str(w.message)]
    assert hooked == ["experimental_config.cuda_decode_kernels: LlamaForCausalLM decodes with Inductor's kernels: "
                      "the kernel set runs on CUDA (Triton); the model is on cpu"]
    assert model.generation_config.cache_implementation == "static"
    assert hookup.hookup_of(model) is None
    remove_for_generate(model)


def test_remove_refuses_to_drop_a_scope_wrapped_around_the_hooked_forward():
    """(Runs where Triton is importable, in make test-triton: a covered model's install imports the operator. The
    model stays on the CPU; device="cuda" only passes the coverage check, nothing is launched.)"""
    import superkernel as sk

    model = tiny()
    forward = type(model.model.layers[0]).forward
    if not TRITON:
        pytest.skip("install needs the kernels' module importable (Triton) once the model is covered")
    hookup.install(model, config(), device="cuda")
    sk.apply_scopes(model, {"layers": "model.layers.*"})
    with pytest.raises(RuntimeError, match="remove_scopes"):
        hookup.remove(model)
    sk.remove_scopes(model)
    hookup.remove(model)
    assert model.model.layers[0].forward.__func__ is forward
