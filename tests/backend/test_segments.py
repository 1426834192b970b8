"""Segmentation: cuts at unfusable operators, names, reasons, strict abort, user registry."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.pipeline.segments import DATA_DEPENDENT_SHAPE, HOST_SYNC, build_segments, unregister_unfusable

CAPTURE_DATA_DEPENDENT = dict(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)


def scoped_with_cuts(x, w):
    with sk.super_kernel("s"):
        y = (x @ w).relu()
        k = int((y > 0).sum().item())  # host synchronization
        out = y[:, :1] * k
        idx = torch.nonzero(y > 0.5)  # data-dependent output shape
        z = out.sum() + idx.shape[0]
    return out + 1, z


def line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "line_of" not in line)


def compile_ro(fn, **cfg_extra):
    """Reduce-overhead with the flat program (``cpu.native`` off): segmentation is the subject here, and each of
    these tiny graphs would otherwise be a native C++ build of its own (tests/backend/test_native_cpu.py
    covers that realization; test_uncut_scope_keeps_plain_name keeps one here)."""
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False}, **cfg_extra})
    backend = sk.get_backend(cfg)
    return torch.compile(fn, backend=backend, dynamic=False), backend


def test_cuts_at_item_and_nonzero_with_names_and_reasons():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch._dynamo.config.patch(**CAPTURE_DATA_DEPENDENT):
        fn, backend = compile_ro(scoped_with_cuts)
        out = fn(x, w)
    expected = scoped_with_cuts(x, w)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    ex = sk.explain(backend)
    cuts = ex.cuts
    assert [c.op for c in cuts] == ["aten::_local_scalar_dense", "aten::nonzero"]
    assert cuts[0].reason.startswith(HOST_SYNC) and cuts[1].reason.startswith(DATA_DEPENDENT_SHAPE)
    assert cuts[0].source == f"{__file__}:{line_of('# host synchronization')}"
    assert cuts[1].source == f"{__file__}:{line_of('# data-dependent output shape')}"
    names = [s.name for s in ex.segments]
    assert len(names) == 3 and all(n.startswith("s_split_") for n in names)
    first, last = names[0].split("_")[-2:]
    assert int(first) <= int(last) < cuts[0].node_index
    text = str(ex)
    assert "aten::nonzero" in text and "s_split_" in text and cuts[1].source in text


def test_boolean_mask_indexing_is_a_cut():
    def f(x):
        with sk.super_kernel("m"):
            y = x.sin()
            sel = y[y > 0]
            return sel.sum() + y.sum()

    with torch._dynamo.config.patch(**CAPTURE_DATA_DEPENDENT):
        fn, backend = compile_ro(f)
        x = torch.randn(16)
        assert torch.equal(fn(x), f(x))
    (cut,) = sk.explain(backend).cuts
    assert cut.op == "aten::index.Tensor" and "boolean-mask" in cut.reason


def test_uncut_scope_keeps_plain_name():
    def f(x):
        with sk.super_kernel("whole"):
            return (x.sin() * 2).cos()

    fn, backend = compile_ro(f, cpu={"native": True})
    fn(torch.randn(3))
    ex = sk.explain(backend)
    assert [s.name for s in ex.segments] == ["whole"] and ex.cuts == []
    assert ex.segments[0].num_ops == 3 and ex.segments[0].realization == "cpu-native"


def test_strict_abort_raises_naming_scope_op_line_and_reason():
    def f(x):
        with sk.super_kernel("strict", "strict-scope-check=abort"):
            y = x.relu()
            n = torch.nonzero(y)
            return y.sum() + n.shape[0]

    with torch._dynamo.config.patch(**CAPTURE_DATA_DEPENDENT):
        fn, _ = compile_ro(f)
        with pytest.raises(sk.SuperKernelScopeError) as info:
            fn(torch.randn(8))
    message = str(info.value)
    assert "scope 'strict'" in message and "aten::nonzero" in message and "test_segments.py:" in message
    assert DATA_DEPENDENT_SHAPE in message
    assert info.value.cut.op == "aten::nonzero"


@pytest.mark.parametrize("op", [torch.ops.aten.cumsum, torch.ops.aten.cumsum.default, "aten::cumsum", "cumsum"],
                         ids=["packet", "overload", "qualified-name", "short-name"])
def test_register_unfusable_cuts_the_scope(op):
    def f(x):
        with sk.super_kernel("s"):
            return x.sin().cumsum(0).cos()

    sk.register_unfusable(op, "scan kernels do not fit our superkernel")
    try:
        fn, backend = compile_ro(f)
        x = torch.randn(8)
        assert torch.equal(fn(x), f(x))
        (cut,) = sk.explain(backend).cuts
        assert cut.op == "aten::cumsum" and cut.reason == "scan kernels do not fit our superkernel"
        assert [s.name for s in sk.explain(backend).segments] == ["s_split_1_1", "s_split_3_3"]
    finally:
        unregister_unfusable(op)
    with pytest.raises(TypeError, match="expects a torch op"):
        sk.register_unfusable(42, "x")


def test_build_segments_on_a_graph_directly():
    """The segmentation stage runs on any ATen graph with scope annotations."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        def fw(g, _):
            graphs.append(g)
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    def f(x):
        with sk.super_kernel("a"):
            x = x.sin()
        with sk.super_kernel("b"):
            x = x.cos()
        return x.exp()

    torch.compile(f, backend=backend)(torch.randn(2))
    seg = build_segments(graphs[0])
    assert [(p.kind, p.name) for p in seg.partitions] == [("segment", "a"), ("segment", "b"), ("unscoped", "unscoped_3_3")]


def test_graph_break_inside_scope_is_reported(tmp_path):
    def f(x):
        with sk.super_kernel("s"):
            y = x.sin()
            torch._dynamo.graph_break()
            return y.cos()

    fn, backend = compile_ro(f)
    x = torch.randn(4)
    assert torch.equal(fn(x), f(x))
    assert sk.explain(backend).graph_breaks >= 1


def test_graph_dump_writes_captured_and_segmented(tmp_path):
    def f(x):
        with sk.super_kernel("s"):
            return x.sin().cos()

    for kind in ("txt", "py"):
        torch._dynamo.reset()
        fn, _ = compile_ro(f, debug={"graph_dump": {"type": kind, "path": str(tmp_path / kind)}})
        fn(torch.randn(3))
        captured = (tmp_path / kind / f"graph_0_captured.{kind}").read_text()
        segmented = (tmp_path / kind / f"graph_0_segmented.{kind}").read_text()
        assert "aten.sin" in captured
        assert "sk_s" in segmented  # the step calls the segment's callable


def test_cpu_work_inside_a_cuda_scope_is_a_cut():
    """Checked on FakeTensors, so it needs no GPU: a CUDA graph reading a CPU tensor would
    bake its value in at capture time, so such ops are cut."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, host):
        with sk.super_kernel("gpu"):
            y = x.sin()
            z = y + host.to(x.device)  # host-to-device copy of a CPU tensor
            return z.cos(), (host * 2)

    # Trace with FakeTensors that claim to live on CUDA; annotations need preserve_node_meta.
    with FakeTensorMode(), torch.fx.traceback.preserve_node_meta():
        gm = make_fx(f, tracing_mode="fake")(torch.empty(4, device="cuda"), torch.empty(4))
    from superkernel.runtime.realizations import REALIZATIONS

    assert build_segments(gm).cuts == []  # a rule of the CUDA rows, not of segmentation
    for mode in ("reduce-overhead", "max-autotune"):
        seg = build_segments(gm, cut_rule=REALIZATIONS[(mode, "cuda")].cut_reason)
        reasons = {c.op: c.reason for c in seg.cuts}
        assert any("reads the CPU tensor" in r for r in reasons.values())
        assert any("computes on the CPU" in r for r in reasons.values())


def test_graph_break_between_two_graphs_of_one_scope_is_a_cut():
    """A break the frame can resume from (here: outside the annotation block but inside
    the scope's region via two blocks with the same label) cuts the scope across graphs."""
    def f(x):
        with sk.super_kernel("s"):
            y = x.sin()
        torch._dynamo.graph_break()
        with sk.super_kernel("s"):
            return y.cos()

    fn, backend = compile_ro(f)
    x = torch.randn(4)
    assert torch.equal(fn(x), f(x))
    ex = sk.explain(backend)
    assert len(ex.graphs) == 2
    (cut,) = ex.cuts
    assert cut.scope == "s" and cut.reason.startswith("graph break") and "graph_break" in cut.reason
