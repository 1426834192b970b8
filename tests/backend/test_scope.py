"""Scope API: annotations reach the ATen graph; nesting, None, helper, apply/remove_scopes."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.scope import node_scope
from superkernel.scope_apply import ScopeGlobError, scoped_modules


def aten_graph_scopes(fn, *args):
    """Compile fn with a backend that records (op, scope) for every ATen op."""
    from torch._functorch.aot_autograd import aot_module_simplified

    seen = []

    def backend(gm, example_inputs):
        def fw(g, _):
            seen.extend((str(n.target), node_scope(n)[0]) for n in g.graph.nodes if n.op == "call_function")
            return g

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    with torch.no_grad():
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return seen


def test_scope_is_noop_in_eager():
    x = torch.randn(3)
    with sk.super_kernel("a", "stream-fusion=1"):
        y = x * 2
    assert torch.equal(y, x * 2)


def test_nesting_innermost_wins_and_none_marks_unfused():
    def f(x):
        with sk.super_kernel("outer"):
            a = x.sin()
            with sk.super_kernel("inner"):
                b = a.cos()
            with sk.super_kernel(None):
                c = b.exp()
            with sk.super_kernel(""):
                d = c.neg()
            e = d.abs()
        return e.tanh()

    ops = aten_graph_scopes(f, torch.randn(4))
    assert ops == [("aten.sin.default", "outer"), ("aten.cos.default", "inner"), ("aten.exp.default", ""),
                   ("aten.neg.default", ""), ("aten.abs.default", "outer"), ("aten.tanh.default", "")]


def test_same_label_in_two_places_is_one_scope_in_two_segments():
    def f(x):
        with sk.super_kernel("s"):
            x = x.sin()
        x = x + 1
        with sk.super_kernel("s"):
            x = x.cos()
        return x

    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "reduce-overhead"}))
    out = torch.compile(f, backend=backend)(torch.randn(4))
    assert out.shape == (4,)
    ex = sk.explain(backend)
    assert ex.scopes == ["s"]
    assert [s.name for s in ex.segments] == ["s_split_1_1", "s_split_3_3"]


def test_superkernel_scope_helper_on_and_off():
    def f(x, enable):
        with sk.superkernel_scope(enable, "decode_layers", ""):
            return x.sin()

    assert aten_graph_scopes(lambda x: f(x, True), torch.randn(2)) == [("aten.sin.default", "decode_layers")]
    torch._dynamo.reset()
    assert aten_graph_scopes(lambda x: f(x, False), torch.randn(2)) == [("aten.sin.default", "")]


class TwoLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.ModuleDict({"attn": torch.nn.Linear(4, 4), "mlp": torch.nn.Linear(4, 4)}) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer["mlp"](layer["attn"](x).relu())
        return x


def test_apply_scopes_wraps_matching_modules_and_remove_restores():
    model = TwoLayer()
    x = torch.randn(2, 4)
    expected = model(x)
    wrapped = sk.apply_scopes(model, {"attn": "layers.*.attn"}, options="stream-fusion=1")
    assert wrapped == ["layers.0.attn", "layers.1.attn"]
    assert scoped_modules(model) == {"layers.0.attn": "attn", "layers.1.attn": "attn"}
    assert torch.equal(model(x), expected)
    ops = aten_graph_scopes(model, x)
    assert [s for op, s in ops if "addmm" in op] == ["attn", "", "attn", ""]
    assert sk.remove_scopes(model) == ["layers.0.attn", "layers.1.attn"]
    assert scoped_modules(model) == {}
    assert "forward" not in model.layers[0]["attn"].__dict__
    torch._dynamo.reset()
    assert [s for op, s in aten_graph_scopes(model, x) if "addmm" in op] == ["", "", "", ""]


def test_apply_scopes_bad_glob_lists_close_names_and_changes_nothing():
    model = TwoLayer()
    with pytest.raises(ScopeGlobError, match=r"'layers\.\*\.atn' matches no submodule; close module paths: .*layers\.\*\.attn"):
        sk.apply_scopes(model, {"ok": "layers.*.mlp", "bad": "layers.*.atn"})
    assert scoped_modules(model) == {}


def test_apply_scopes_rejects_conflicting_labels():
    model = TwoLayer()
    with pytest.raises(ValueError, match="matched by scopes 'a' and 'b'"):
        sk.apply_scopes(model, {"a": "layers.0.attn", "b": "layers.*.attn"})


@pytest.mark.parametrize("options, message", [
    ("stream-fusion=2", r"invalid value '2' for scope option 'stream-fusion'; allowed values: 0, 1"),
    ("colour=red", r"unknown scope option 'colour'; allowed: stream-fusion in \{0, 1\}; strict-scope-check in \{bypass, abort\}"),
    ("stream-fusion", r"scope option 'stream-fusion' is missing '='"),
    ("strict-scope-check=maybe", r"allowed values: bypass, abort"),
])
def test_bad_options_raise_value_error_naming_key_and_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        sk.super_kernel("a", options)


def test_options_parse():
    opts = sk.parse_options("stream-fusion=1:strict-scope-check=abort")
    assert opts.stream_fusion and opts.abort_on_cut
    assert sk.parse_options("") == sk.parse_options(None) == sk.scope.ScopeOptions()
