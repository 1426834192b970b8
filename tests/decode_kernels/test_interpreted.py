"""The decode kernel set (runtime/cuda/decode_kernels) against float64 references under Triton's CPU interpreter.

Needs Triton (``make test-triton`` installs it in its own venv and sets TRITON_INTERPRET=1); skipped where Triton is
not importable, as in the project venv (torch's CPU build ships no Triton). Full Llama-3.2-1B shapes run with large
blocks (few interpreted programs); every launch candidate of ``configs.CANDIDATES`` runs at the real K on a slice of
the output rows or heads; odd shapes (nothing a power of two or a multiple of a block) with blocks that leave tails.
Tolerance: ``reference.bf16_tolerance`` (bfloat16 output rounding, 2**-8 of each value, plus 2e-3 of the largest);
the interpreter is patched to round bfloat16 as the GPU does (``interpret.fix_bf16``).
"""

from __future__ import annotations


import pytest
import torch

from .interpreter_setup import kernel_device

DEVICE = kernel_device()

from superkernel.runtime.cuda.decode_kernels import problems, reference  # noqa: E402
from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES, LLAMA_1B, DecodeShape  # noqa: E402
from superkernel.runtime.cuda.decode_kernels.interpret import interpreting  # noqa: E402

#: Every dimension odd or off the blocks: hidden 300 (K tails of 128/256/512 blocks), head_dim 40 (pairs 20: BLOCK_P
#: tails; attention's D padded to 64), GQA group 3 (padded to 16 rows), intermediate 333, vocab 1001, cache 77.
ODD = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
#: Llama-3.2-1B's per-head and K dimensions with 4 q heads over 1 kv head: the candidates' qkv/attention programs are
#: the real ones, fewer of them.
LLAMA_1B_FEW_HEADS = DecodeShape(hidden=2048, n_q_heads=4, n_kv_heads=1, head_dim=64, intermediate=8192,
                                 vocab=128256, kv_len=162)
#: Large blocks for the full shapes (the interpreter's cost is per program and per operation, not per element).
FULL_LAUNCH = {"qkv_rope": dict(block_p=32, block_k=2048), "attention": dict(splits=4, block_s=64),
               "o_proj": dict(block_n=256, block_k=2048), "gate_up": dict(block_n=512, block_k=2048),
               "down": dict(block_n=256, block_k=2048), "lm_head": dict(block_n=256, block_k=1024, split_k=2)}
#: lm_head's 128256 x 2048 weight: the real K, the first 4099 rows (an odd count: a tail in every block).
LM_HEAD_ROWS = 4099


def run(name: str, shape: DecodeShape, launch: dict, **make) -> dict[str, float]:
    inputs = problems.make_inputs(name, shape, DEVICE, **make)
    return problems.check(name, inputs, shape, problems.call(name, inputs, shape, launch))


@pytest.mark.parametrize("name", problems.NAMES)
def test_each_kernel_at_llama_1b_shape(name):
    rows = LM_HEAD_ROWS if name == "lm_head" else None
    errors = run(name, LLAMA_1B, FULL_LAUNCH[name], rows=rows)
    print(name, errors)
    assert all(e > 0 for e in errors.values()), "bfloat16 outputs equal to float64 everywhere: nothing was computed?"


@pytest.mark.parametrize("name,launch", [(n, c) for n in problems.NAMES for c in CANDIDATES[n]],
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_every_launch_candidate_at_the_real_k(name, launch):
    shape = LLAMA_1B_FEW_HEADS if name in ("qkv_rope", "attention") else LLAMA_1B
    run(name, shape, launch, rows=40)


@pytest.mark.parametrize("name", problems.NAMES)
@pytest.mark.parametrize("variant", ["default", "small-blocks"])
def test_odd_shapes(name, variant):
    launch = dict(CANDIDATES[name][0])
    if variant == "small-blocks":
        launch.update({"qkv_rope": dict(block_p=8, block_k=128), "attention": dict(splits=5, block_s=16),
                       "gate_up": dict(block_n=8, block_k=128), "lm_head": dict(block_n=16, block_k=128, split_k=3),
                       }.get(name, dict(block_n=8, block_k=128, split_k=2)))
    run(name, ODD, launch)


@pytest.mark.parametrize("length,splits", [(1, 1), (1, 8), (3, 8), (17, 4), (76, 3)])
def test_attention_lengths_and_empty_splits(length, splits):
    """Short lengths leave splits with no position (lse -inf, zeros); the reduction must ignore them."""
    run("attention", ODD, dict(splits=splits, block_s=16), length=length)


def test_attention_reads_only_the_first_length_positions():
    inputs = problems.make_inputs("attention", ODD, DEVICE, length=20)
    want = problems.expected("attention", inputs, ODD)["out"]
    inputs["k_cache"][:, :, 20:] = float("nan")  # the rest of a static cache: never read
    inputs["v_cache"][:, :, 20:] = float("nan")
    got = problems.call("attention", inputs, ODD, dict(splits=4, block_s=16))
    reference.check("attention", got, want)


def test_qkv_rope_writes_only_the_step_row_of_each_cache():
    inputs = problems.make_inputs("qkv_rope", ODD, DEVICE, length=30)
    inputs["k_cache"].fill_(7.0)
    inputs["v_cache"].fill_(-7.0)
    result = problems.call("qkv_rope", inputs, ODD, CANDIDATES["qkv_rope"][0])
    problems.check("qkv_rope", inputs, ODD, result)
    others = [p for p in range(ODD.kv_len) if p != 29]
    assert bool((inputs["k_cache"][0, :, others] == 7.0).all()) and bool((inputs["v_cache"][0, :, others] == -7.0).all())


def test_a_wrong_kernel_output_fails_the_check():
    """The tolerance is tight enough to see a dropped norm weight, the residual left out or k not rotated."""
    inputs = problems.make_inputs("o_proj", ODD, DEVICE)
    want = problems.expected("o_proj", inputs, ODD)["out"]
    with pytest.raises(AssertionError, match="beyond the bfloat16 tolerance"):
        reference.check("o_proj", want - reference._d(inputs["residual"]), want)
    q_inputs = problems.make_inputs("qkv_rope", ODD, DEVICE)
    problems.call("qkv_rope", q_inputs, ODD, CANDIDATES["qkv_rope"][0])
    unrotated = reference.gemv(q_inputs["x"], q_inputs["w_qkv"], norm=q_inputs["norm"])
    k_rows = unrotated[ODD.n_q_heads * ODD.head_dim: (ODD.n_q_heads + ODD.n_kv_heads) * ODD.head_dim]
    with pytest.raises(AssertionError, match="beyond the bfloat16 tolerance"):
        reference.check("k", q_inputs["k_cache"][0, :, ODD.kv_len - 2], k_rows.reshape(ODD.n_kv_heads, -1))


@pytest.mark.skipif(not interpreting(), reason="the interpreter's bfloat16 only")
def test_the_interpreters_bf16_dot_and_rounding_are_fixed():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b))

    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    c = torch.empty(16, 16)
    dot_kernel[(1,)](a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)

    @triton.jit
    def cast_kernel(x_ptr, y_ptr):
        r = tl.arange(0, 8)
        tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))

    x = torch.tensor([4.184, -4.184, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9, 3.0, 1e-30, float("inf"), float("nan")])
    y = torch.empty(8, dtype=torch.bfloat16)
    cast_kernel[(1,)](x, y)
    torch.testing.assert_close(y, x.to(torch.bfloat16), rtol=0, atol=0, equal_nan=True)  # torch rounds to nearest


def _layer_inputs(shape: DecodeShape, seed: int) -> tuple[torch.Tensor, ...]:
    """A decode layer's inputs in bfloat16, seeded: hidden state, RoPE cos / sin, K and V caches."""
    gen = torch.Generator().manual_seed(seed)
    kc = torch.randn(1, shape.n_kv_heads, shape.kv_len, shape.head_dim, generator=gen).to(DEVICE, torch.bfloat16)
    vc = torch.randn(1, shape.n_kv_heads, shape.kv_len, shape.head_dim, generator=gen).to(DEVICE, torch.bfloat16)
    x = torch.randn(shape.hidden, generator=gen).to(DEVICE, torch.bfloat16)
    angles = torch.rand(shape.head_dim // 2, generator=gen) * 6
    cos = torch.cat([angles.cos()] * 2).to(DEVICE, torch.bfloat16)
    sin = torch.cat([angles.sin()] * 2).to(DEVICE, torch.bfloat16)
    return x, cos, sin, kc, vc


@pytest.mark.parametrize("shape", [ODD, LLAMA_1B_FEW_HEADS], ids=["odd", "llama-1b-dims-4-heads"])
def test_a_whole_layer_of_six_launches_against_float64(shape):
    """The layer's intermediates (q, K/V rows, attention output, h, the MLP's input) are rounded to bfloat16
    between the launches, as the layer stores them: the eager forms' wider floor."""
    from superkernel.runtime.cuda.decode_kernels import layer

    weights = layer.LayerWeights.random(shape, DEVICE)
    pos = 40
    x, cos, sin, kc, vc = _layer_inputs(shape, seed=1)
    before = kc.clone(), vc.clone()
    want = layer.reference_layer(x, weights, cos, sin, pos, *before, shape)
    launches = None if shape is ODD else FULL_LAUNCH  # (the 1B widths: few programs, for the interpreter)
    got = layer.decode_layer(x, weights, cos, sin, torch.tensor([pos], device=DEVICE),
                             torch.tensor([pos + 1], device=DEVICE), kc, vc, shape, launches)
    reference.check("layer", got, want, floor=problems.EAGER_FLOOR)
    # the check sees the attention part: the layer one position earlier (one K/V row fewer) is another output
    with pytest.raises(AssertionError, match="beyond the bfloat16 tolerance"):
        reference.check("layer", got, layer.reference_layer(x, weights, cos, sin, pos - 1, *before, shape),
                        floor=problems.EAGER_FLOOR)


# -- int8 weight-only: int8 rows widened to float32 in the loop, a float32 scale per output channel --------------

@pytest.mark.parametrize("name,variant", [(n, "default") for n in problems.WEIGHTED]
                         + [(n, "split-k") for n in ("o_proj", "down", "lm_head")])
def test_int8_weight_only_at_odd_shapes(name, variant):
    """Every weight-reading kernel with int8 weights against float64 of (int8 * scale) at the odd shape; the GEMVs
    also split along K (partials carry the scale; qkv_rope and gate_up have no split-K form)."""
    launch = dict(CANDIDATES[name][0])
    if variant == "split-k":
        launch.update(block_n=8, block_k=128, split_k=3)
    run(name, ODD, launch, int8=True)


@pytest.mark.parametrize("name,split_k", [("o_proj", 4), ("down", 4), ("lm_head", 2)])
def test_int8_split_k_gemv_at_llama_1b_k(name, split_k):
    """The int8 split-K GEMV at the 1B step's real K (lm_head: its first rows), large blocks for the interpreter."""
    launch = dict(FULL_LAUNCH[name], split_k=split_k)
    run(name, LLAMA_1B, launch, int8=True, rows=LM_HEAD_ROWS if name == "lm_head" else None)


def test_int8_needs_its_scale_and_a_wrong_scale_fails_the_check():
    from superkernel.runtime.cuda.decode_kernels.gemv import gemv

    inputs = problems.make_inputs("o_proj", ODD, DEVICE, int8=True)
    with pytest.raises(ValueError, match="int8 weight needs its per-channel scale"):
        gemv(inputs["x"], inputs["w"], residual=inputs["residual"])
    want = problems.expected("o_proj", inputs, ODD)["out"]
    got = gemv(inputs["x"], inputs["w"], residual=inputs["residual"], scale=inputs["scale"].flip(0))
    with pytest.raises(AssertionError, match="beyond the bfloat16 tolerance"):
        reference.check("o_proj", got, want)


def test_a_whole_int8_layer_against_float64():
    from superkernel.runtime.cuda.decode_kernels import layer

    weights = layer.LayerWeights.random(ODD, DEVICE).quantized_int8()
    assert weights.int8 and weights.w_qkv.dtype == torch.int8
    pos = 30
    x, cos, sin, kc, vc = _layer_inputs(ODD, seed=2)
    want = layer.reference_layer(x, weights, cos, sin, pos, kc.clone(), vc.clone(), ODD)
    got = layer.decode_layer(x, weights, cos, sin, torch.tensor([pos], device=DEVICE),
                             torch.tensor([pos + 1], device=DEVICE), kc, vc, ODD)
    reference.check("int8 layer", got, want, floor=problems.EAGER_FLOOR)
