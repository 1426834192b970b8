"""An int4 model's prompt under a max-autotune plan runs superkernel's int4 kernel, not ATen's float32 reference loop
(superkernel.runtime.cpu.int4_eager); a reduce-overhead plan's prompt stays eager's bit for bit."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from superkernel.runtime.cpu import int4_eager  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    if not int4_eager.available():
        pytest.skip("no vector int4 kernel on this CPU (or it cannot be built here)")
    return getattr(torch.ops.superkernel, int4_eager.KERNEL_OP).default


def _int4_linear(n: int, k: int) -> torch.nn.Module:
    from superkernel.tools.quantize import quantize_model

    torch.manual_seed(n + k)
    model = torch.nn.Sequential(torch.nn.Linear(k, n))
    quantize_model(model, "int4-weight", group_size=32)
    return model


def test_the_mode_sends_a_float32_int4_linear_to_the_kernel(kernel):
    model, x = _int4_linear(128, 256), torch.randn(7, 256)
    w = model[0].weight
    aten = model(x)
    with int4_eager.Int4Kernel() as mode:
        got = model(x)
    assert mode.routed == 1
    assert torch.equal(got, kernel(x, w.qdata, 32, w.scale_and_zero) + model[0].bias)
    assert not torch.equal(got, aten)  # the kernel ran (float32 sums in another order) ...
    torch.testing.assert_close(got, aten, rtol=1e-5, atol=1e-5 * aten.abs().max().item())  # ... the same product


def test_a_call_the_kernel_cannot_take_stays_atens(kernel):
    model, x = _int4_linear(48, 256), torch.randn(3, 256)  # 48 outputs: ATen packs them, the kernel takes 64s
    aten = model(x)
    with int4_eager.Int4Kernel() as mode:
        got = model(x)
    assert mode.routed == 0 and torch.equal(got, aten)


def _prompt_logits(model, prompt):
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=1, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.logits[0]


def test_apply_for_generate_runs_an_int4_prompt_on_the_kernel_under_max_autotune_only(kernel):
    """The prompt of a small int4 Llama (every width a multiple of 64): max-autotune routes every int4 linear to the kernel (the logits agree with
    ATen's to float32 rounding); reduce-overhead installs nothing (eager's logits bit for bit); the decode steps
    still compile with the hooks in place (Dynamo traces them as nothing) and give the prompt's first token; and
    remove_for_generate takes the hooks off."""
    import superkernel
    from transformers import LlamaConfig, LlamaForCausalLM

    from superkernel.tools.quantize import quantize_model

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
                                         max_position_embeddings=64)).eval()
    info = quantize_model(model, "int4-weight")
    prompt = torch.tensor([[1, 5, 9, 13, 17, 21]])
    eager = _prompt_logits(model, prompt)
    superkernel.apply_for_generate(model, "mlp", mode="reduce-overhead")
    assert not hasattr(model, "_superkernel_int4_prompt_kernel") and torch.equal(_prompt_logits(model, prompt), eager)
    superkernel.apply_for_generate(model, "mlp", mode="max-autotune")
    routed = model._superkernel_int4_prompt_kernel
    got = _prompt_logits(model, prompt)
    assert routed.routed == info.layers - 1  # every int4 linear once (the head is int8-weight)
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4 * eager.abs().max().item())
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert tokens[0, prompt.shape[1]] == got.argmax() and routed.routed == 2 * (info.layers - 1)
    superkernel.remove_for_generate(model)
    assert not hasattr(model, "_superkernel_int4_prompt_kernel")
    assert not model._forward_pre_hooks and not model._forward_hooks
