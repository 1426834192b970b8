"""Scope API: annotations reach the ATen graph; nesting, None, helper, apply/remove_scopes."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.pipeline import backend as sk_backend
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

    backend = sk.get_backend(_ro_config())
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


# --- scopes survive Dynamo under the default configuration -------------------------------
#
# No torch._dynamo.config patch here: superkernel's backends trace with
# capture_scalar_outputs / capture_dynamic_output_shape_ops on, so a data-dependent op
# or host sync inside a scope becomes a cut instead of a graph break that loses the scope.

def _data_dependent(kind):
    def f(x):
        with sk.super_kernel("blk"):
            y = x.sin() * 2
            if kind == "nonzero":
                z = y.sum() + torch.nonzero(y > 0).shape[0]
            elif kind == "mask":
                z = y[y > 0].sum()
            else:  # item
                z = y.sum() * (y > 0).sum().item()
            return y.cos() + z
    return f


CUT_OP = {"nonzero": "aten::nonzero", "mask": "aten::index", "item": "aten::_local_scalar_dense"}


def _ro_config():
    """Reduce-overhead with the flat program: scope semantics are the subject, and each tiny graph here would
    otherwise be a native C++ build of its own (that realization: tests/backend/test_native_cpu.py)."""
    return sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False}})


@pytest.mark.parametrize("kind", ["nonzero", "mask", "item"])
@pytest.mark.parametrize("entry", ["superkernel.compile", "backend=superkernel-instance"])
def test_data_dependent_op_in_scope_is_a_cut_by_default(kind, entry):
    torch._dynamo.reset()
    assert not torch._dynamo.config.capture_scalar_outputs  # the default is untouched outside the compile
    f = _data_dependent(kind)
    if entry == "superkernel.compile":
        fn = sk.compile(f, _ro_config())
        backend = sk_backend.find_backend(fn)
    else:
        backend = sk.get_backend(_ro_config())
        fn = torch.compile(f, backend=backend, dynamic=False)
    x = torch.randn(16)
    assert torch.equal(fn(x), f(x))
    ex = sk.explain(backend)
    assert len(ex.graphs) == 1, str(ex)
    assert any(c.op.startswith(CUT_OP[kind]) and c.scope == "blk" for c in ex.cuts), str(ex)
    assert all(s.name.startswith("blk_split_") for s in ex.segments) and len(ex.segments) >= 2
    assert not torch._dynamo.config.capture_scalar_outputs  # restored after the call


def test_backend_string_superkernel_captures_the_scope_by_default():
    torch._dynamo.reset()
    backend = sk_backend.default_backend()
    backend.reset()
    f = _data_dependent("nonzero")
    fn = torch.compile(f, backend="superkernel", dynamic=False)
    x = torch.randn(16)
    # the registered backend runs the default mode, max-autotune: TorchInductor may round differently
    torch.testing.assert_close(fn(x), f(x))
    ex = sk.explain(backend)
    assert len(ex.graphs) == 1 and any(c.op.startswith("aten::nonzero") for c in ex.cuts), str(ex)


def _printing(options):
    def f(x):
        with sk.super_kernel("blk", options):
            y = x.sin()
            print("side effect", end="")  # a graph break Dynamo cannot capture
            return y.cos()
    return f


def test_other_graph_break_in_scope_is_reported_with_scope_reason_and_line():
    torch._dynamo.reset()
    backend = sk.get_backend(_ro_config())
    f = _printing("")
    fn = torch.compile(f, backend=backend, dynamic=False)
    x = torch.randn(4)
    with pytest.warns(sk_backend.SuperKernelScopeBreakWarning, match=r"scope 'blk'.*test_scope\.py:\d+.*print"):
        assert torch.equal(fn(x), f(x))
    (cut,) = backend.scope_breaks
    assert cut.scope == "blk" and cut.source.endswith(f"test_scope.py:{_line_of('a graph break Dynamo cannot')}")


def _records_as_torch_2_11_logs_them(line: int) -> list[str]:
    """The two graph-break records torch 2.11 logs for ``_printing``'s print (text as it writes them, shortened):
    the break itself, whose traceback has no ``with`` line, then the follow-up naming ``annotate``."""
    frames = (f'User code traceback:\n  File "{__file__}", line {line}, in f\n'
              '    print("side effect", end="")  # a graph break Dynamo cannot capture\n')
    at = f"Graph break in user code at {__file__}:{line}\n"
    return [at + "Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call\n\n"
                 "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin operator "
                 "`print` with argument types ['str'] (has_kwargs True)\n\n" + frames,
            at + "Graph Break Reason: Failed to handle graph break gracefully. Skipping the function and falling back "
                 "to eager. Graph break encountered:\n\ntorch.fx.traceback.annotate escaped from compiled region\n"
                 "  Explanation: Dynamo doesn't support graph break on torch.fx.traceback.annotate.\n\n" + frames]


def test_a_break_logged_as_torch_2_11_logs_it_names_its_scope_and_its_own_reason():
    """torch 2.11 (the GPU machines') skips the whole frame on a break inside ``annotate`` and logs no ``with``
    line: the scope is read from the source around the break, the reason from the break's own record (torch
    2.13 logs the ``with`` line: the test above). Checked against the text 2.11 writes; `make test-gpu-versions`
    runs the test above on 2.11 itself."""
    line = _line_of("a graph break Dynamo cannot")
    backend = sk.get_backend(_ro_config())
    with pytest.warns(sk_backend.SuperKernelScopeBreakWarning, match=r"scope 'blk'.*test_scope\.py:\d+.*`print`"):
        backend._scope_breaks(_records_as_torch_2_11_logs_them(line))
    (cut,) = backend.scope_breaks
    assert cut.scope == "blk" and cut.source.endswith(f"test_scope.py:{line}")
    assert "print" in cut.reason and "annotate" not in cut.reason
    assert sk_backend.scope_of_break(_records_as_torch_2_11_logs_them(line)[0]) is None  # no mark of a scope in it


def test_other_graph_break_in_scope_aborts_under_strict():
    def f(x):
        with sk.super_kernel("strict_blk", "strict-scope-check=abort"):
            y = x.sin()
            print("side effect", end="")
            return y.cos()

    torch._dynamo.reset()
    backend = sk.get_backend(_ro_config())
    fn = torch.compile(f, backend=backend, dynamic=False)
    with pytest.raises(sk.SuperKernelScopeError, match=r"scope 'strict_blk'.*test_scope\.py:\d+.*print"):
        fn(torch.randn(4))


def test_graph_break_in_an_applied_scope_names_it_and_aborts():
    class Printing(torch.nn.Module):
        def forward(self, x):
            y = x.sin()
            print("side effect", end="")
            return y.cos()

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Printing()

        def forward(self, x):
            return self.inner(x) + 1

    model = Outer()
    sk.apply_scopes(model, {"applied": "inner"}, options="strict-scope-check=abort")
    try:
        torch._dynamo.reset()
        fn = torch.compile(model, backend=sk.get_backend(_ro_config()), dynamic=False)
        with pytest.raises(sk.SuperKernelScopeError, match=r"scope 'applied'"):
            fn(torch.randn(4))
    finally:
        sk.remove_scopes(model)


def _line_of(marker):
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if marker in line and "_line_of" not in line)


@pytest.mark.parametrize("scopes, message", [
    ({"x": []}, "scope 'x' has no module glob"),
    ({"x": [""]}, "scope 'x' has no module glob"),
    ({"x": 5}, "must map to a module glob or a list of globs"),
    ("attn", "needs a mapping of scope label -> module glob"),
    (["attn"], "needs a mapping of scope label -> module glob"),
])
def test_apply_scopes_rejects_malformed_scopes_clearly(scopes, message):
    model = TwoLayer()
    with pytest.raises((ValueError, TypeError), match=message):
        sk.apply_scopes(model, scopes)
    assert scoped_modules(model) == {}


def test_data_dependent_op_under_strict_abort_raises_by_default():
    def f(x):
        with sk.super_kernel("strict_dd", "strict-scope-check=abort"):
            y = x.sin()
            n = torch.nonzero(y > 0)  # the op strict mode refuses
            return y.sum() + n.shape[0]

    torch._dynamo.reset()
    fn = sk.compile(f, _ro_config())
    with pytest.raises(sk.SuperKernelScopeError, match=r"scope 'strict_dd'.*aten::nonzero.*test_scope\.py:\d+"):
        fn(torch.randn(8))


def test_options_string_first_seen_while_dynamo_traces() -> None:
    """super_kernel() validates options without touching the parse cache, so a string
    nobody parsed before compiles (it once failed with 'Guard failed on the same frame')."""
    from superkernel.ir import graph as ir

    opts = "strict-scope-check=bypass:stream-fusion=0"
    ir._PARSED.pop(opts, None)

    def f(x):
        with sk.super_kernel("fresh", opts):
            return (x * 2).relu()

    fn = sk.compile(f, _ro_config())
    x = torch.randn(4)
    assert torch.equal(fn(x), f(x))
    assert [s.name for s in sk.explain(fn).segments] == ["fresh"]


def test_a_removed_scope_does_not_name_a_later_break_in_the_same_file():
    """Graph breaks are mapped to scopes by source file: only scopes applied now count, so a
    scope removed earlier (other label, no options) cannot hide a later strict-scope-check=abort."""
    from superkernel.scope_apply import applied_scopes_in

    first = torch.nn.Sequential(torch.nn.Linear(2, 2))
    sk.apply_scopes(first, {"earlier": "0"})
    sk.remove_scopes(first)
    second = torch.nn.Sequential(torch.nn.Linear(2, 2))
    sk.apply_scopes(second, {"now": "0"}, options="strict-scope-check=abort")
    try:
        record = f"scoped_forward\n  File \"{torch.nn.Linear.forward.__code__.co_filename}\", line 1"
        assert applied_scopes_in(record) == [("now", "strict-scope-check=abort")]
    finally:
        sk.remove_scopes(second)
    assert applied_scopes_in(record) == []
