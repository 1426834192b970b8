"""The hookup (runtime/cuda/decode_kernels/hookup.py) on a tiny bfloat16 Hugging Face Llama, on the CPU under
Triton's interpreter: a decode step through ``superkernel::llama_decode_layer`` against the same model's own step and
against float64; the prefill untouched; int8 weight-only (torchao's layout) through the same operator; and the step
captured by the superkernel backend in max-autotune (its exactness reference, ``debug.run_eagerly``: the ATen graph
AOTAutograd makes, run op by op, no Inductor compile) with the operator in place of the layer's ~40 operators.

Needs Triton and transformers (``make test-triton`` installs both in ``.venv-triton``); skipped elsewhere. The CUDA
form of these checks (one CUDA graph per step, Inductor compiling the glue) is ``test_hookup_cuda`` below, marked
``cuda``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from .interpreter_setup import kernel_device

DEVICE = kernel_device()
transformers = pytest.importorskip("transformers", reason="transformers is not installed here")

from superkernel.runtime.cuda.decode_kernels import coverage, hookup  # noqa: E402

PROMPT, CACHE = 7, 16


def tiny_llama(dtype=torch.bfloat16, seed=0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    values = dict(hidden_size=96, intermediate_size=112, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=16, vocab_size=101, max_position_embeddings=64, rms_norm_eps=1e-5)
    values.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**values)).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms off 1, so a dropped norm weight shows
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(DEVICE, dtype)


def config(mode="max-autotune", on=True, **debug):
    import superkernel as sk

    cfg = sk.CompilerConfig()
    cfg.mode = mode
    cfg.experimental_config.cuda_decode_kernels = on
    for k, v in debug.items():
        setattr(cfg.debug, k, v)
    return cfg


def prefilled(model, prompt):
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=CACHE)
    with torch.no_grad():
        model(prompt, cache=cache, use_cache=True)
    return cache


def decode(model, cache, token):
    with torch.no_grad():
        return model(token, cache=cache, use_cache=True).logits[0, -1]


def float64_logits(model, prompt, token):
    m64 = copy.deepcopy(model).to(torch.float64)
    hookup.remove(m64)
    cache = prefilled(m64, prompt)
    return decode(m64, cache, token)


def inputs(seed=1):
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 101, (1, PROMPT), generator=gen).to(DEVICE)
    token = torch.randint(0, 101, (1, 1), generator=gen).to(DEVICE)
    return prompt, token


def test_a_hooked_decode_step_matches_the_models_own_step_and_float64():
    model = tiny_llama()
    prompt, token = inputs()
    plain_cache = prefilled(model, prompt)
    want_bf16 = decode(model, plain_cache, token)
    want64 = float64_logits(model, prompt, token)

    hooked = hookup.install(model, config())
    assert hooked is not None and hooked.layers == 2 and hooked.weights == "bfloat16"
    cache = prefilled(model, prompt)  # the prefill: the layers' own forward (not a decode step), no warning
    kc_before = cache.layers[0].keys.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a covered step warns nothing
        got = decode(model, cache, token)
    # both caches written at the step's row, nothing else changed, the position advanced by one
    assert int(cache.layers[0].cumulative_length) == PROMPT + 1
    assert torch.equal(cache.layers[0].keys[:, :, :PROMPT], kc_before[:, :, :PROMPT])
    assert bool(cache.layers[0].keys[:, :, PROMPT].ne(0).any())
    torch.testing.assert_close(cache.layers[1].keys[:, :, PROMPT].float(),
                               plain_cache.layers[1].keys[:, :, PROMPT].float(), rtol=0.02, atol=0.02)
    err_set = float((got.double() - want64).abs().max())
    err_hf = float((want_bf16.double() - want64).abs().max())
    # the set rounds once per kernel output where the bfloat16 model rounds after every operator
    assert err_set <= 1.5 * err_hf + 1e-3, (err_set, err_hf)
    assert int(got.argmax()) == int(want64.argmax())
    # the step really went through the kernels: without the hookup the same model's step is another computation
    assert not torch.equal(got, want_bf16)


def test_a_hooked_step_with_the_cache_position_off_by_one_is_caught():
    """The check above can fail: attending one position fewer (a wrong length) moves the logits past it."""
    model = tiny_llama()
    prompt, token = inputs()
    want64 = float64_logits(model, prompt, token)
    hookup.install(model, config())
    cache = prefilled(model, prompt)
    for lay in cache.layers:
        lay.cumulative_length.sub_(1)  # the step now overwrites the prompt's last token instead of appending
    got = decode(model, cache, token)
    assert float((got.double() - want64).abs().max()) > 5e-2


def test_remove_puts_the_models_own_forward_back():
    model = tiny_llama()
    forward = type(model.model.layers[0]).forward
    hookup.install(model, config())
    assert model.model.layers[0].forward.__func__ is not forward if hasattr(model.model.layers[0].forward,
                                                                            "__func__") else True
    hookup.remove(model)
    assert model.model.layers[0].forward.__func__ is forward
    assert not any(n.startswith("_sk_dk_") for n, _ in model.named_buffers())
    assert hookup.hookup_of(model) is None


def test_an_int8_weight_only_model_decodes_through_the_same_operator():
    """torchao's int8 weight-only model (quantize_ with Int8WeightOnlyConfig): the hookup unwraps its Int8Tensor
    weights into int8 rows and scales; the step against float64 of the same int8 * scale weights, and within the
    error of torchao's own bfloat16 step."""
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = tiny_llama()
    quantize_(model.model.layers, Int8WeightOnlyConfig())
    deq = copy.deepcopy(model)  # the same weights dequantized exactly (float64), as plain parameters
    with torch.no_grad():
        for lin in [m for m in deq.model.layers.modules() if isinstance(m, torch.nn.Linear)]:
            w = lin.weight
            lin.weight = torch.nn.Parameter(w.qdata.double() * w.scale.double().reshape(-1, 1),
                                            requires_grad=False)
    del torchao
    prompt, token = inputs()
    want64 = float64_logits(deq, prompt, token)  # float64 of int8 * scale
    want_ao = decode(model, prefilled(model, prompt), token)  # torchao's own step, before the hookup
    hooked = hookup.install(model, config())
    assert hooked.weights == "int8-weight"
    assert model.model.layers[0]._sk_dk_w_qkv.dtype == torch.int8
    got = decode(model, prefilled(model, prompt), token)
    err_set = float((got.double() - want64).abs().max())
    err_ao = float((want_ao.double() - want64).abs().max())
    assert err_set <= 1.5 * err_ao + 1e-3, (err_set, err_ao)
    assert int(got.argmax()) == int(want64.argmax())


def test_the_superkernel_backend_captures_the_operator_in_place_of_the_layer():
    """max-autotune's capture with the hookup: the ATen graph holds one llama_decode_layer per layer and no
    matrix product of the layers (only lm_head's), and its exactness reference (run_eagerly) gives the hooked
    eager step's logits exactly."""
    import superkernel as sk

    model = tiny_llama(num_hidden_layers=2)
    prompt, token = inputs()
    hookup.install(model, config())
    eager_cache = prefilled(model, prompt)
    want = decode(model, eager_cache, token)
    cfg = config(run_eagerly=True)
    sk.apply_scopes(model, {"all_layers": "model.layers.*"})
    graphs = []
    backend = sk.get_backend(cfg)

    def recording(gm, example_inputs):
        graphs.append(gm)
        return backend(gm, example_inputs)

    cache = prefilled(model, prompt)
    step = torch.compile(lambda t, c: model(t, cache=c, use_cache=True).logits, backend=recording, dynamic=False)
    with torch.no_grad():
        got = step(token, cache)[0, -1]
    sk.remove_scopes(model)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert sum("llama_decode_layer" in t for t in targets) == 2, targets
    assert sum("linear" in t for t in targets) == 1, targets  # lm_head only
    assert int(cache.layers[0].cumulative_length) == PROMPT + 1


def test_max_autotune_compiles_the_glue_around_the_operator_and_explain_names_the_hooked_layers():
    """The real max-autotune compile (Inductor's CPU backend here: the glue; the operator stays a call, its kernels
    interpreted): the same logits as the hooked eager step within bfloat16, and explain() names the two layers."""
    import superkernel as sk

    model = tiny_llama()
    prompt, token = inputs()
    hookup.install(model, config())
    want = decode(model, prefilled(model, prompt), token)
    sk.apply_scopes(model, {"all_layers": "model.layers.*"})
    backend = sk.get_backend(config())
    step = torch.compile(lambda t, c: model(t, cache=c, use_cache=True).logits, backend=backend, dynamic=False)
    cache = prefilled(model, prompt)
    with torch.no_grad():
        got = step(token, cache)[0, -1]
    sk.remove_scopes(model)
    torch.testing.assert_close(got.float(), want.float(), rtol=0.02, atol=0.02)
    assert int(got.argmax()) == int(want.argmax())
    text = str(sk.explain(backend))
    assert "decode kernel set: 2 layer(s) as superkernel::llama_decode_layer" in text, text
    assert backend.counters["decode_kernel_layers"] == 2


def test_an_uncovered_step_warns_once_and_runs_the_layers_own_forward():
    model = tiny_llama()
    hookup.install(model, config())
    prompt = torch.randint(0, 101, (2, PROMPT)).to(DEVICE)
    cache = prefilled(model, prompt)  # batch 2: the prefill is silent
    token = torch.randint(0, 101, (2, 1)).to(DEVICE)
    with pytest.warns(UserWarning, match="batch 2: the set decodes batch 1") as record:
        decode(model, cache, token)
        decode(model, cache, token)
    assert sum("batch 2" in str(w.message) for w in record) == 1
    assert hookup.hookup_of(model).declined == ["batch 2: the set decodes batch 1"]
    assert coverage.NOT_A_DECODE_STEP not in hookup.hookup_of(model).declined


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_hookup_cuda_max_autotune_step_is_one_cuda_graph_with_the_operator():
    """On the card: max-autotune, decoder_layer scopes, the flag on. Four decode steps through the compiled step:
    each one CUDA graph replay, the ATen graph holding the operator per layer, the logits within the bfloat16 gate
    of the hooked eager step (Inductor compiles the glue: the embedding, rotary, final norm and lm_head)."""
    import superkernel as sk

    model = tiny_llama(num_hidden_layers=2)
    prompt, token = inputs()
    hookup.install(model, config())
    sk.apply_scopes(model, {f"decoder_layer_{i}": f"model.layers.{i}" for i in range(2)})
    backend = sk.get_backend(config())
    step = torch.compile(lambda t, c: model(t, cache=c, use_cache=True).logits, backend=backend, dynamic=False)
    eager_cache, cache = prefilled(model, prompt), prefilled(model, prompt)
    with torch.no_grad():
        for i in range(4):
            t = (token + i) % 101
            want = model(t, cache=eager_cache, use_cache=True).logits
            got = step(t, cache)
            torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
    sk.remove_scopes(model)
    ex = sk.explain(backend)
    (cg,) = ex.graphs[0].cuda_graphs
    assert cg.status == "captured", cg.describe()
    assert int(cache.layers[0].cumulative_length) == PROMPT + 4
