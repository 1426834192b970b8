"""The rules on real ATen graphs (Inductor's decompositions): what they match, where they do not, and
that a rewritten graph computes what the original does."""

from __future__ import annotations

import torch

from superkernel.runtime.inductor.autofusion.rules import gemm_epilogue, horizontal_gemm, moe_experts, rotary_attention
from tests.autofusion.graphs import aten_graph, qkv, qkv_bias, weights


def _placeholders_after_first(gm):
    return {n for n in gm.graph.nodes if n.op == "placeholder"} - {next(iter(gm.graph.nodes))}


def test_qkv_is_one_candidate_and_the_rewrite_computes_the_same():
    x, ws = torch.randn(1, 1, 32), weights(32, [32, 16, 16])
    gm = aten_graph(qkv, x, *ws)
    weight_nodes = _placeholders_after_first(gm)
    cands, misses = horizontal_gemm.match(gm, lambda n: n in weight_nodes)
    assert len(cands) == 1 and misses == []
    (c,) = cands
    assert (c.m, c.k, c.ns, c.constant) == (1, 32, [32, 16, 16], True)
    expected = gm(x, *ws)
    horizontal_gemm.apply(gm, c)
    mms = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert len(mms) == 1 and mms[0].meta["val"].shape == (1, 64)
    got = gm(x, *ws)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_addmm_with_bias_and_several_rows():
    x, ps = torch.randn(5, 24), weights(24, [8, 8, 40], bias=True)
    gm = aten_graph(qkv_bias, x, *ps)
    (c,), _ = horizontal_gemm.match(gm, lambda n: n.op == "placeholder" and n.name != "x_1")
    assert c.gemms[0].bias is not None and c.m == 5
    expected = gm(x, *ps)
    horizontal_gemm.apply(gm, c)
    assert sum(n.target is torch.ops.aten.addmm.default for n in gm.graph.nodes) == 1
    for a, b in zip(gm(x, *ps), expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_non_constant_weights_are_a_candidate_marked_not_constant():
    x, ws = torch.randn(1, 16), weights(16, [16, 16])
    gm = aten_graph(lambda x, a, b: (torch.nn.functional.linear(x, a), torch.nn.functional.linear(x, b)), x, *ws)
    (c,), _ = horizontal_gemm.match(gm, lambda n: False)
    assert not c.constant


def test_a_gemm_alone_is_reported_not_matched_with_where():
    def two_inputs(x, z, a, b):
        return torch.nn.functional.linear(x, a), torch.nn.functional.linear(z, b)

    x, z, (a, b) = torch.randn(1, 16), torch.randn(1, 16), weights(16, [16, 16])
    gm = aten_graph(two_inputs, x, z, a, b)
    cands, misses = horizontal_gemm.match(gm, lambda n: True)
    assert cands == []
    assert len(misses) == 2 and all("no other GEMM reads" in why for _, why in misses)


def test_epilogue_and_prologue_chains_are_found():
    def block(x, w, g, wo):
        var = x.pow(2).mean(-1, keepdim=True)
        y = x * torch.rsqrt(var + 1e-6) * g
        return x + torch.nn.functional.linear(y, w) @ wo.t()

    x, (w, wo), g = torch.randn(1, 16), weights(16, [16, 16]), torch.ones(16)
    gm = aten_graph(block, x, w, g, wo)
    epilogues, prologues = gemm_epilogue.chains(gm)
    assert len(epilogues) == 1 and len(prologues) == 1


def test_rotary_into_sdpa_is_found_and_reported_not_built():
    def attention(q, k, v, cos, sin):
        def rotate(t):
            return t * cos + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin
        return torch.nn.functional.scaled_dot_product_attention(rotate(q), rotate(k), v)

    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 5, 16), torch.randn(1, 4, 5, 16)
    gm = aten_graph(attention, q, k, v, torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
    rotary, plain = rotary_attention.chains(gm)
    assert len(rotary) == 1 and rotary[0].startswith("rotary->") and plain == []
    gm = aten_graph(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v), q, k, v)
    assert rotary_attention.chains(gm)[0] == [] and len(rotary_attention.chains(gm)[1]) == 1


def test_gemms_on_a_3d_experts_weight_are_found():
    def experts(x, w, dense):
        return x @ w[1].t(), x @ dense.t()

    gm = aten_graph(experts, torch.randn(2, 16), torch.randn(4, 8, 16), torch.randn(8, 16))
    assert len(moe_experts.expert_gemms(gm)) == 1
