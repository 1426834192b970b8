"""graph-autofusion refuses, up front (exit 2), an input ONNX Runtime cannot run or that is not deterministic,
instead of reporting a failed verification of the fused model (exit 1)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from superkernel.onnx.cli import main
from superkernel.onnx.input_check import randomness, unknown_operators


def _model(nodes, initializers=(), opsets=(("", 17),), functions=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                          initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], functions=list(functions))
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _custom_op(domain="my.domain", op="MyOp"):
    return _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["r"], ["y"], domain=domain,
                                                                            name="custom0")],
                  opsets=(("", 17), (domain, 1)))


def _dropout(training=True):
    return _model([helper.make_node("Relu", ["x"], ["r"]),
                   helper.make_node("Dropout", ["r", "ratio", "train"], ["y"], name="drop0")],
                  [helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]),
                   helper.make_tensor("train", TensorProto.BOOL, [], [training])])


def _run(capsys, tmp_path, model, *extra):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    code = main(["--input", str(src), "--output", str(out), "--no-calibrate", *extra])
    captured = capsys.readouterr()
    return code, [ln for ln in captured.err.splitlines() if ln.strip()], out


def test_an_operator_in_an_unknown_domain_is_refused_naming_it(tmp_path, capsys):
    code, lines, out = _run(capsys, tmp_path, _custom_op())
    assert code == 2 and len(lines) == 1 and not out.exists()
    assert lines[0].startswith("graph-autofusion: error:") and "ONNX Runtime cannot run the input" in lines[0]
    assert "my.domain:MyOp (node 'custom0')" in lines[0] and "domain 'my.domain', which ONNX Runtime does not know" \
        in lines[0]
    assert "fused model" not in lines[0]


def test_an_unknown_operator_of_a_known_domain_is_named_too(tmp_path, capsys):
    code, lines, _ = _run(capsys, tmp_path, _custom_op("com.microsoft", "NoSuchFusedOp"))
    assert code == 2 and "com.microsoft:NoSuchFusedOp" in lines[0] and "has no such operator" in lines[0]


def test_dropout_in_training_mode_is_refused_as_a_non_deterministic_input(tmp_path, capsys):
    code, lines, out = _run(capsys, tmp_path, _dropout())
    assert code == 2 and len(lines) == 1 and not out.exists()
    assert "the input is not deterministic" in lines[0] and "output 'y'" in lines[0]
    assert "Dropout (node 'drop0') is in training mode" in lines[0]
    assert "verification failed" not in lines[0]


def test_a_random_operator_is_named_as_the_reason(tmp_path, capsys):
    model = _model([helper.make_node("RandomNormalLike", ["x"], ["n"], name="noise"),
                    helper.make_node("Add", ["x", "n"], ["y"])])
    code, lines, _ = _run(capsys, tmp_path, model)
    assert code == 2 and "not deterministic" in lines[0] and "RandomNormalLike (node 'noise') draws random values" \
        in lines[0]


def test_an_inference_dropout_passes_and_no_verify_skips_the_check(tmp_path, capsys):
    code, lines, out = _run(capsys, tmp_path, _dropout(training=False))
    assert code == 0 and out.exists(), lines
    code, lines, out = _run(capsys, tmp_path, _dropout(), "--no-verify")
    assert code == 0 and out.exists(), lines  # the user opted out of running it in ONNX Runtime


def test_unknown_operators_against_a_kernel_table():
    fn = helper.make_function("local.fns", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    model = _model([helper.make_node("Twice", ["x"], ["t"], domain="local.fns"),
                    helper.make_node("Gelu", ["t"], ["g"], domain="com.microsoft"),
                    helper.make_node("Odd", ["g"], ["y"], domain="com.microsoft")],
                   opsets=(("", 17), ("local.fns", 1), ("com.microsoft", 1)), functions=[fn])
    found = unknown_operators(ir.from_proto(model), kernels={("com.microsoft", "Gelu"), ("", "Relu")})
    assert found == ["operator com.microsoft:Odd is in domain 'com.microsoft', which has no such operator in "
                     "ONNX Runtime"]


def test_randomness_reads_the_training_mode():
    assert randomness(ir.from_proto(_dropout(training=False))) == []
    assert randomness(ir.from_proto(_dropout())) == [
        "Dropout (node 'drop0') is in training mode (training_mode = true: an export in training mode)"]
