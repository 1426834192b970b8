"""The float64 references the decode kernels are checked against (runtime/cuda/decode_kernels/reference.py) compute
what a Hugging Face Llama layer computes, and their tolerance accepts a perfectly rounded bfloat16 output and
rejects a wrong one. No Triton needed: these run in the project venv."""

from __future__ import annotations

import math

import pytest
import torch

from superkernel.runtime.cuda.decode_kernels import problems, reference
from superkernel.runtime.cuda.decode_kernels.configs import LLAMA_1B, DecodeShape

try:
    from transformers.models.llama import modeling_llama as llama
except ImportError:  # (the Triton venv has no transformers: the Llama comparisons run in the project venv)
    llama = None
needs_transformers = pytest.mark.skipif(llama is None, reason="transformers is not installed here")


@needs_transformers
def test_rms_norm_is_llamas():
    """(LlamaRMSNorm computes in float32 whatever its input: the float64 reference agrees to float32's precision.)"""
    x = torch.randn(1, 1, 300, dtype=torch.float64)
    norm = llama.LlamaRMSNorm(300, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(300))
        torch.testing.assert_close(reference.rms_normed(x[0, 0], norm.weight, 1e-5), norm(x)[0, 0], rtol=2e-6,
                                   atol=2e-6)


@needs_transformers
def test_rotary_embedding_is_llamas_rotate_half():
    head_dim, pos = 40, 29
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.cat([pos * inv_freq] * 2)
    cos, sin = angles.cos(), angles.sin()
    q, k = torch.randn(1, 6, 1, head_dim, dtype=torch.float64), torch.randn(1, 2, 1, head_dim, dtype=torch.float64)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, cos[None, None], sin[None, None])
    torch.testing.assert_close(reference.rotate(q[0, :, 0], cos, sin), q_hf[0, :, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference.rotate(k[0, :, 0], cos, sin), k_hf[0, :, 0], rtol=1e-12, atol=1e-12)


def test_decode_attention_is_sdpa_with_gqa_over_the_first_length_positions():
    q, kc, vc = (torch.randn(6, 40, dtype=torch.float64), torch.randn(2, 77, 40, dtype=torch.float64),
                 torch.randn(2, 77, 40, dtype=torch.float64))
    want = torch.nn.functional.scaled_dot_product_attention(q[None, :, None], kc[None, :, :30], vc[None, :, :30],
                                                            enable_gqa=True)[0, :, 0]
    torch.testing.assert_close(reference.decode_attention(q, kc, vc, 30), want, rtol=1e-10, atol=1e-10)


def test_gate_up_is_silu_gate_times_up():
    x, g = torch.randn(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64)
    wg, wu = torch.randn(8, 64, dtype=torch.float64), torch.randn(8, 64, dtype=torch.float64)
    n = x / torch.sqrt(x.pow(2).mean() + 1e-5)
    torch.testing.assert_close(reference.gate_up(x, g, wg, wu), torch.nn.functional.silu(wg @ n) * (wu @ n))


def test_the_tolerance_takes_a_perfectly_rounded_bf16_output_and_rejects_a_few_ulps_off():
    ref = torch.randn(4096, dtype=torch.float64) * 3
    assert reference.check("rounded", ref.to(torch.bfloat16), ref) <= 2.0 ** -8
    wrong = ref.to(torch.bfloat16).double()
    wrong[123] += 0.05 * ref.abs().max()  # 5 % of the largest output at one element
    with pytest.raises(AssertionError, match="1 of 4096 elements"):
        reference.check("wrong", wrong, ref)
    with pytest.raises(AssertionError, match="non-finite"):
        reference.check("nan", torch.full_like(ref, math.nan), ref)


def test_problems_make_the_llama_1b_tensors_on_meta_without_memory():
    q = problems.make_inputs("qkv_rope", LLAMA_1B, "meta")
    assert q["w_qkv"].shape == (3072, 2048) and q["k_cache"].shape == (1, 8, 162, 64) and q["x"].is_meta
    assert problems.make_inputs("lm_head", LLAMA_1B, "meta")["w"].shape == (128256, 2048)
    assert problems.make_inputs("gate_up", LLAMA_1B, "meta")["w_up"].shape == (8192, 2048)
    assert problems.make_inputs("down", LLAMA_1B, "meta")["w"].shape == (2048, 8192)
    assert problems.make_inputs("down", LLAMA_1B, "cpu", rows=40)["w"].shape == (40, 8192)
    odd = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
    a = problems.make_inputs("attention", odd, "cpu", length=5)
    assert a["k_cache"].shape == (1, 2, 77, 40) and int(a["length"]) == 5


@pytest.mark.parametrize("name", problems.NAMES)
def test_the_eager_pytorch_form_of_each_kernel_matches_its_reference(name):
    """eager.py (what the GPU benchmark compiles with Inductor, and the hookup's patterns) computes what the
    kernel computes, within bfloat16 (it rounds between its operators as a Llama layer does: a wider floor)."""
    from superkernel.runtime.cuda.decode_kernels import eager

    odd = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
    inputs = problems.make_inputs(name, odd, "cpu", length=30)
    out = eager.function(name, odd)(**inputs)
    problems.check(name, inputs, odd, out, floor=problems.EAGER_FLOOR)
    with pytest.raises(AssertionError):  # and the wider floor still sees a wrong result
        problems.check(name, inputs, odd, out * 1.1, floor=problems.EAGER_FLOOR)


def test_the_eager_qkv_rope_compiles_with_inductor_and_writes_the_caches():
    """The GPU benchmark compiles these with Inductor: Dynamo traces the cache writes (index_copy_ on inputs) in one
    graph (here Inductor's CPU backend), and the compiled form writes the step's row as the eager one does."""
    from superkernel.runtime.cuda.decode_kernels import eager

    odd = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
    inputs = problems.make_inputs("qkv_rope", odd, "cpu", length=30)
    compiled = torch.compile(eager.function("qkv_rope", odd), dynamic=False, fullgraph=True)
    problems.check("qkv_rope", inputs, odd, compiled(**inputs), floor=problems.EAGER_FLOOR)


def test_the_opt_in_flag_is_off_by_default_validated_and_warns_that_it_is_not_measured_yet():
    import superkernel as sk

    cfg = sk.CompilerConfig()
    assert cfg.experimental_config.cuda_decode_kernels is False
    with pytest.raises(TypeError, match="cuda_decode_kernels must be bool"):
        cfg.experimental_config.cuda_decode_kernels = "on"
    plain = cfg.fingerprint()
    cfg.experimental_config.cuda_decode_kernels = True
    assert cfg.fingerprint() != plain  # (a build with the kernels will differ: packages must not be shared)
    with pytest.warns(UserWarning, match="not yet measured on a GPU"):
        sk.get_backend(compiler_config=cfg)


@needs_transformers
def test_the_layer_chain_of_references_is_a_hugging_face_llama_decode_step():
    """layer.reference_layer over every layer, then the final norm and lm_head (reference.gemv), from the caches
    a prefill left: the logits of Hugging Face's LlamaForCausalLM decode step with a StaticCache, in float64. What
    the six launches a layer are checked against is the model's step."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    from superkernel.runtime.cuda.decode_kernels import layer

    cfg = LlamaConfig(hidden_size=96, intermediate_size=112, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, head_dim=16, vocab_size=101, max_position_embeddings=64,
                      rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).double().eval()
    cache = StaticCache(config=cfg, max_cache_len=16)
    prompt, token, pos = torch.randint(0, 101, (1, 5)), torch.randint(0, 101, (1, 1)), 5
    shape = DecodeShape(hidden=96, n_q_heads=6, n_kv_heads=2, head_dim=16, intermediate=112, vocab=101, kv_len=16)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(pos))
        caches = [(lay.keys.clone(), lay.values.clone()) for lay in cache.layers]
        want = model(token, past_key_values=cache, use_cache=True, cache_position=torch.tensor([pos])).logits[0, -1]
        x = model.model.embed_tokens(token)[0, 0]
        cos, sin = model.model.rotary_emb(x[None, None], torch.tensor([[pos]]))
        for decoder, (kc, vc) in zip(model.model.layers, caches):
            x = layer.reference_layer(x, layer.LayerWeights.from_hf(decoder), cos[0, 0], sin[0, 0], pos, kc, vc, shape)
        got = reference.gemv(x, model.lm_head.weight, norm=model.model.norm.weight, eps=1e-5)
    # (LlamaRMSNorm computes in float32 whatever its input: 3e-8 apart on these logits of up to 0.5; leaving the
    # rotary out moves them by 7e-3, attending one position fewer by 0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
