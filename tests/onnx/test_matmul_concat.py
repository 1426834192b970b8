"""matmul_concat: MatMuls of one input with constant weights become one MatMul on the
concatenated weights and a Split, on small synthetic graphs built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from superkernel.onnx import calibrate, catalog, engine
from superkernel.onnx import verify as V

D = 16
FASTER = calibrate.Calibrator(measure=lambda unfused, fused: (10.0, 5.0))  # the decision is not under test


def _model(nodes, inits, outputs, *, opset=17, x_type=TensorProto.FLOAT, inputs=()):
    x = helper.make_tensor_value_info("x", x_type, [1, 3, D])
    outs = [helper.make_tensor_value_info(o, x_type, None) for o in outputs]
    g = helper.make_graph(nodes, "g", [x, *inputs], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _w(name, n, dtype=np.float32, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal((D, n)).astype(dtype), name)


def swiglu(opset=17):
    """gate_proj / up_proj of one input feeding SiLU(gate) * up (Llama's MLP)."""
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"], name="gate"),
             helper.make_node("MatMul", ["x", "wu"], ["u"], name="up"),
             helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["a"]),
             helper.make_node("Mul", ["a", "u"], ["y"])]
    return _model(nodes, [_w("wg", 24, seed=1), _w("wu", 24, seed=2)], ["y"], opset=opset)


def qkv():
    """Three projections of different widths (grouped-query K/V), each output used."""
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
             helper.make_node("Relu", ["q"], ["qr"])]
    return _model(nodes, [_w("wq", 16, seed=1), _w("wk", 8, seed=2), _w("wv", 8, seed=3)], ["qr", "k", "v"])


def _fuse(tmp_path, proto, calibrator=FASTER, name="m"):
    src = tmp_path / f"{name}.onnx"
    onnx.save(proto, src)
    model = ir.load(str(src))
    res = engine.fuse(model, catalog.select_rules("matmul_concat", 2), calibrator=calibrator)
    out = tmp_path / f"{name}_fused.onnx"
    ir.save(model, str(out))
    return res, model, str(src), str(out)


@pytest.mark.parametrize("build,k", [(swiglu, 2), (qkv, 3)])
def test_matmuls_of_one_input_become_one_matmul_and_a_split(tmp_path, build, k):
    res, model, src, out = _fuse(tmp_path, build())
    (cand,) = res.applied
    assert cand.rule == "matmul_concat" and len(cand.nodes) == k
    ops = engine.op_counts(model.graph)
    assert ops["MatMul"] == 1 and ops["Split"] == 1, ops
    (mm,) = [n for n in model.graph if n.op_type == "MatMul"]
    assert list(mm.inputs[1].const_value.shape) == [D, sum(_widths(build()))]
    v = V.verify(src, out)  # ORT, every output, the per-dtype tolerance
    assert v.ok, [(o.name, o.reason) for o in v.failed]


def _widths(proto):
    return [numpy_helper.to_array(t).shape[1] for t in proto.graph.initializer]


def test_output_values_keep_their_names_and_graph_outputs(tmp_path):
    res, model, src, out = _fuse(tmp_path, qkv())
    assert [o.name for o in model.graph.outputs] == ["qr", "k", "v"]
    split = next(n for n in model.graph if n.op_type == "Split")
    assert [o.name for o in split.outputs] == ["q", "k", "v"]
    assert V.verify(src, out).ok


def test_opset_12_writes_split_sizes_as_an_attribute(tmp_path):
    res, model, src, out = _fuse(tmp_path, swiglu(opset=12))
    assert res.applied
    split = next(n for n in model.graph if n.op_type == "Split")
    assert len(split.inputs) == 1 and list(split.attributes["split"].value) == [24, 24]
    assert V.verify(src, out).ok


def test_estimate_alone_does_not_concatenate_two(tmp_path):
    # uncalibrated: two MatMuls -> MatMul + Split saves no operator and adds the concatenated product
    res, model, _, _ = _fuse(tmp_path, swiglu(), calibrator=None)
    assert not res.applied and res.skipped and not res.skipped[0].benefit.positive
    assert engine.op_counts(model.graph)["MatMul"] == 2


def test_measured_slower_is_not_kept(tmp_path):
    res, _, _, _ = _fuse(tmp_path, qkv(), calibrator=calibrate.Calibrator(measure=lambda u, f: (5.0, 6.0)))
    assert not res.applied and res.skipped[0].reason.startswith("not faster when measured")


def _two(second_input="x", second_weight="w2", extra_nodes=(), inits=None, inputs=(), x_type=TensorProto.FLOAT):
    nodes = [*extra_nodes, helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("MatMul", [second_input, second_weight], ["b"], name="mm2")]
    return _model(nodes, inits if inits is not None else [_w("w1", 8), _w("w2", 8, seed=1)], ["a", "b"],
                  inputs=inputs, x_type=x_type)


@pytest.mark.parametrize("case,proto,why", [
    ("different inputs", lambda: _two(second_input="y", inputs=[
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, D])]), None),
    ("weight is a graph input", lambda: _two(second_weight="wi", inputs=[
        helper.make_tensor_value_info("wi", TensorProto.FLOAT, [D, 8])]), "not a constant"),
    ("transposed B", lambda: _two(second_weight="wt", extra_nodes=[
        helper.make_node("Transpose", ["w2"], ["wt"], perm=[1, 0])], inits=[_w("w1", 8), numpy_helper.from_array(
            np.ones((8, D), np.float32), "w2")]), "transposed B"),
    ("different dtypes", lambda: _two(inits=[_w("w1", 8), _w("w2", 8, dtype=np.float64)]), "dtype"),
    ("integer MatMul", lambda: _two(inits=[numpy_helper.from_array(np.ones((D, 8), np.int32), "w1"),
                                           numpy_helper.from_array(np.ones((D, 8), np.int32), "w2")],
                                    x_type=TensorProto.INT32), None),
])
def test_non_matching_groups_are_left_alone(tmp_path, case, proto, why):
    res, model, _, _ = _fuse(tmp_path, proto(), name=case.replace(" ", "_"))
    assert not res.candidates, case
    assert engine.op_counts(model.graph)["MatMul"] == 2
    near = [m for m in res.near_misses if m.rule == "matmul_concat"]
    if why is None:
        assert not near, near  # a lone MatMul is not worth a near miss
    else:
        assert any(why in m.reason for m in near), (case, res.near_misses)
