"""graph-autofusion on ONNX Runtime-quantized models: quantize_dynamic (DynamicQuantizeLinear + MatMulInteger),
MatMulNBits (int4 weight-only, operator and QDQ form). The fused model verifies against the quantized input, runs
in ONNX Runtime, keeps every quantized node, and ONNX Runtime still runs the same integer kernels on it; no rule
rewrites a quantized node into something ONNX Runtime runs in float; a quantization ONNX Runtime's CPU provider
cannot run is refused up front."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from superkernel.onnx import catalog, engine, zoo
from superkernel.onnx import quant as Q
from superkernel.onnx import verify as V
from superkernel.onnx.cli import main
from superkernel.onnx.input_check import quantization_failures


def _cpu_has(domain: str, op: str) -> bool:
    from onnxruntime.capi import _pybind_state

    return any(k.domain == domain and k.op_name == op and k.provider == "CPUExecutionProvider"
               for k in _pybind_state.get_all_opkernel_def())


def _nbits_quantizer():
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError:
        return None
    return MatMulNBitsQuantizer if _cpu_has("com.microsoft", "MatMulNBits") else None


NBITS = _nbits_quantizer()
needs_nbits = pytest.mark.skipif(NBITS is None, reason="this onnxruntime has no MatMulNBits quantizer / CPU kernel")


def quantize(src: str, dst: str, how: str) -> str:
    """``src`` quantized by ONNX Runtime's own tools: 'qdyn' quantize_dynamic (int8), 'nbits' MatMulNBits
    (int4, block 32), 'nbits_qdq' the same as DequantizeLinear(int4) -> MatMul."""
    logging.getLogger().setLevel(logging.ERROR)  # the quantizers log every node at INFO / WARNING
    if how == "qdyn":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    else:
        from onnxruntime.quantization import QuantFormat

        fmt = QuantFormat.QDQ if how == "nbits_qdq" else QuantFormat.QOperator
        q = NBITS(onnx.load(src), block_size=32, is_symmetric=True, quant_format=fmt)
        q.process()
        q.model.save_model_to_file(dst, False)
    return dst


@pytest.fixture(scope="module")
def quantized(exported, tmp_path_factory):
    """quantized(key, how) -> path of the zoo model ``key`` quantized ``how`` (cached)."""
    cache: dict = {}
    d = tmp_path_factory.mktemp("quantized")

    def get(key: str, how: str) -> str:
        if (key, how) not in cache:
            cache[key, how] = quantize(exported(key), str(d / f"{key}_{how}.onnx"), how)
        return cache[key, how]

    return get


def counts(path: str) -> dict[str, int]:
    return Q.quantized_op_counts(ir.load(path).graph)


def run_cli(capsys, src, out, *extra):
    code = main(["--input", str(src), "--output", str(out), "--report", str(out) + ".md", "--quiet",
                 *map(str, extra)])
    _, err = capsys.readouterr()
    report = json.loads(open(str(out) + ".json").read()) if code in (0, 1) else None
    return code, err, report


def _check_fused(src: str, out, report) -> None:
    assert report["verification"]["ok"] is True
    before, after = counts(src), counts(str(out))
    assert before and after == before  # every quantized node is still there
    # and ONNX Runtime still turns them into the same integer kernels (nothing it now runs in float)
    assert Q.kernels_kept(Q.ort_kernel_counts(src), Q.ort_kernel_counts(str(out))) is None
    # the fused model runs as users run it (ORT_ENABLE_ALL) and computes what the input computes there; the
    # exact comparison is the product's verification above (both ORT_DISABLE_ALL). Under ORT_ENABLE_ALL,
    # ONNX Runtime's own rewrites (DequantizeLinear -> MatMul into MatMulNBits, int8 activations) move both
    # models by their quantization's rounding, so this looks for a wrong result, not for the last bits.
    level = V.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s0 = V.session(src, level)
    feeds = V.make_inputs(s0, {}, V.VERIFY_DEFAULT_DIM, 1)
    names = [o.name for o in s0.get_outputs()]
    for a, b in zip(s0.run(names, feeds), V.session(str(out), level).run(names, feeds)):
        assert a.shape == b.shape and np.isfinite(b).all()
        assert np.abs(a - b).max() <= 0.02 * np.abs(a).max()


QUANTIZATIONS = ["qdyn", pytest.param("nbits", marks=needs_nbits), pytest.param("nbits_qdq", marks=needs_nbits)]


@pytest.mark.parametrize("how", QUANTIZATIONS)
def test_quantized_decoder_layer_is_fused_verified_and_keeps_its_quantized_nodes(quantized, tmp_path, capsys, how):
    src = quantized("llama", how)
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, src, out, "--no-calibrate")
    assert code == 0, err
    _check_fused(src, out, report)
    # the float parts around the quantized projections are still fused
    assert {"rmsnorm", "rotary", "gqa"} <= {c["rule"] for c in report["applied"]}


@pytest.fixture(scope="module")
def hf_decode_qdyn(tmp_path_factory):
    """A Hugging Face Llama decode step (one token, 15 past positions, TorchScript exporter: what users export)
    quantized with quantize_dynamic. The quantizer saves the value_info of its own shape inference, with
    ``unk__N`` dims where it could not resolve them (the attention mask among them)."""
    from superkernel.onnx import hfsuite

    d = tmp_path_factory.mktemp("hf_decode")
    src = hfsuite.export_built(hfsuite.build("llama_decode", past=15), "legacy", d / "decode.onnx")
    return quantize(str(src), str(d / "decode_qdyn.onnx"), "qdyn")


def test_a_quantized_hugging_face_decode_step_gets_its_attention_fused(hf_decode_qdyn, tmp_path, capsys):
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, hf_decode_qdyn, out, "--no-calibrate")
    assert code == 0, err
    _check_fused(hf_decode_qdyn, out, report)
    # the mask shape the quantizer declared as [unk, unk, unk, T] is inferred afresh: decode attention is found
    assert {"gqa", "rotary", "rmsnorm"} <= {c["rule"] for c in report["applied"]}
    # and the declared value_info the quantizer wrote is put back as it was for every value still there
    declared = {vi.name: vi for vi in onnx.load(hf_decode_qdyn).graph.value_info}
    fused = onnx.load(str(out))
    weights = {t.name for t in fused.graph.initializer}
    written = {vi.name: vi for vi in fused.graph.value_info if vi.name not in weights}
    assert any("unk__" in str(vi.type) for vi in declared.values())
    assert all(written[n].type == declared[n].type for n in written.keys() & declared.keys())
    assert not set(written) - set(declared)  # no inferred shape ends up in the file


def test_constants_kept_in_the_inputs_external_data_are_written_with_the_output(hf_decode_qdyn, tmp_path, capsys):
    """ONNX Runtime's quantizers write small Constant values to external data too (MatMulNBitsQuantizer's
    save_model_to_file(..., True)); a fused model that kept such a Constant (no fusion lifted it: here nothing
    matches ``gemm``, as in the end-to-end check's leave-one-out models) named the input's data file relative to
    the output, and did not load (exit 1)."""
    from onnx.external_data_helper import convert_model_to_external_data

    m = onnx.load(hf_decode_qdyn)
    others = [(a, onnx.TensorProto.FromString(a.t.SerializeToString())) for n in m.graph.node
              if n.op_type != "Constant" for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    # as the quantizers write it: every tensor above a size, Constant values included (here the two [1, 1, 1, 16]
    # mask constants; smaller ones, shapes among them, which ONNX Runtime must read while loading, stay inline)
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="weights.part.data", size_threshold=100,
                                   convert_attribute=True)
    for a, t in others:  # only Constant values
        a.t.CopyFrom(t)
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src))
    assert any(n.op_type == "Constant" and n.attribute[0].t.data_location == TensorProto.EXTERNAL
               for n in onnx.load(str(src), load_external_data=False).graph.node)
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, src, out, "--no-calibrate", "--fusion-rules", "gemm")
    assert code == 0, err
    assert report["verification"]["ok"] is True
    V.session(str(out), V.ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def test_calibrated_run_on_a_quantized_decoder_is_timed_against_the_quantized_input(quantized, tmp_path, capsys):
    src = quantized("llama", "qdyn")
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, src, out, "--threads", "1")
    assert code == 0, err
    _check_fused(src, out, report)
    e2e = report["end_to_end"]
    assert "error" not in e2e and e2e["original_ms"] > 0 and e2e["fused_ms"] > 0
    # the paired test ran on the quantized pair; a confirmed "slower" drops kinds or says why it stopped
    assert e2e["verdict"] != "slower" or e2e["dropped_rules"] or e2e.get("stopped")


def test_a_layernorm_before_dynamic_quantize_linear_still_fuses(quantized, tmp_path, capsys):
    src = quantized("ln_mlp", "qdyn")
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, src, out, "--no-calibrate")
    assert code == 0, err
    _check_fused(src, out, report)
    ln = [n for n in ir.load(str(out)).graph if n.op_type == "LayerNormalization"]
    assert len(ln) == 1 and {u.op_type for u, _ in ln[0].outputs[0].uses()} >= {"DynamicQuantizeLinear"}


class _EmbedNorm(nn.Module):
    """An embedding row, RMSNorm, a projection: quantize_dynamic makes the table int8 (Gather, then
    DequantizeLinear), so the RMSNorm reads a DequantizeLinear output, as in a quantized decoder's layer 0."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.norm = zoo.RMSNorm(32)
        self.proj = nn.Linear(32, 32, bias=False)

    def forward(self, ids):
        return self.proj(self.norm(self.embed(ids)))


def test_an_rmsnorm_reading_a_dequantized_embedding_still_fuses(export_module, tmp_path, capsys):
    src = export_module("embed_norm", _EmbedNorm(), (torch.randint(0, 64, (1, 4)),))
    qsrc = quantize(src, str(tmp_path / "embed_norm_qdyn.onnx"), "qdyn")
    g = ir.load(qsrc).graph
    dq_readers = {u.op_type for n in g if n.op_type == "DequantizeLinear" for u, _ in n.outputs[0].uses()}
    assert {"Pow", "Mul"} & dq_readers  # the RMSNorm reads the dequantized embedding row
    out = tmp_path / "fused.onnx"
    code, err, report = run_cli(capsys, qsrc, out, "--no-calibrate")
    assert code == 0, err
    _check_fused(qsrc, out, report)
    assert "rmsnorm" in {c["rule"] for c in report["applied"]}


# --- the guard: rules that would match on quantized nodes --------------------------------------------------

def _dq_int4_matmul(tail: str, quantized_weight: bool = True, k: int = 64, n: int = 32):
    """x @ W then ``tail`` ('scale': * 0.5, 'bias': + b on 2-D x); W = DequantizeLinear of a constant int4
    block-quantized weight (what ONNX Runtime turns into MatMulNBits), or a float constant."""
    rng = np.random.default_rng(0)
    w4 = rng.integers(-8, 8, (k, n)).astype(np.int8)
    scales = (rng.random((k // 32, n)) * 0.01 + 0.001).astype(np.float32)
    if quantized_weight:
        inits = [helper.make_tensor("wq", TensorProto.INT4, [k, n], w4.flatten().tolist()),
                 numpy_helper.from_array(scales, "ws")]
        nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0, block_size=32, name="dq_w")]
    else:
        inits = [numpy_helper.from_array((w4 * np.repeat(scales, 32, axis=0)).astype(np.float32), "w")]
        nodes = []
    nodes.append(helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"))
    if tail == "scale":
        x_shape = [1, 4, k]
        inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "c"))
        nodes.append(helper.make_node("Mul", ["mm", "c"], ["y"], name="scale"))
    else:
        x_shape = [4, k]
        inits.append(numpy_helper.from_array(rng.random(n).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["mm", "b"], ["y"], name="bias"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape[:-1] + [n])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("tail,rule", [("scale", "fused_matmul_scale"), ("bias", "gemm")])
def test_no_rule_rewrites_a_matmul_of_a_dequantized_int4_weight(tmp_path, tail, rule):
    specs = catalog.select_rules("all", 3)
    # the rule does match the float form of the same graph ...
    plain = ir.from_proto(_dq_int4_matmul(tail, quantized_weight=False))
    assert rule in {c.rule for c in engine.fuse(plain, specs).applied}
    # ... but not the quantized one: FusedMatMul / Gemm would hide DequantizeLinear -> MatMul from ONNX Runtime's
    # MatMulNBits fusion, and the int4 weight would be dequantized to float on every run
    src = tmp_path / "q.onnx"
    onnx.save(_dq_int4_matmul(tail), src)
    model = ir.load(str(src))
    result = engine.fuse(model, specs)
    assert not result.applied
    near = [m for m in result.near_misses if m.rule == rule]
    assert near and "leaves the quantized subgraph alone" in near[0].reason and "DequantizeLinear" in near[0].reason
    out = tmp_path / "fused.onnx"
    ir.save(model, str(out))
    assert counts(str(out)) == counts(str(src)) == {"DequantizeLinear": 1}
    assert Q.ort_kernel_counts(str(out)).get("com.microsoft::MatMulNBits") == 1
    assert Q.kernels_kept(Q.ort_kernel_counts(str(src)), Q.ort_kernel_counts(str(out))) is None


def test_without_the_guard_ort_would_run_the_int4_weight_in_float(tmp_path, monkeypatch):
    """What the guard prevents, seen in ONNX Runtime's own optimized graph: with the guard off,
    fused_matmul_scale turns DequantizeLinear(int4) -> MatMul -> Mul into FusedMatMul, and ONNX Runtime
    runs a DequantizeLinear of the whole weight and a float FusedMatMul instead of MatMulNBits."""
    src = tmp_path / "q.onnx"
    onnx.save(_dq_int4_matmul("scale"), src)
    monkeypatch.setattr(Q, "guard", lambda nodes: None)
    model = ir.load(str(src))
    assert "fused_matmul_scale" in {c.rule for c in engine.fuse(model, catalog.select_rules("all", 3)).applied}
    out = tmp_path / "unguarded.onnx"
    ir.save(model, str(out))
    changed = Q.kernels_kept(Q.ort_kernel_counts(str(src)), Q.ort_kernel_counts(str(out)))
    assert changed and "MatMulNBits: 1 -> 0" in changed and "DequantizeLinear: 0 -> 1" in changed


def test_protected_nodes_of_a_quantize_dynamic_graph(quantized):
    """The integer ops, their dequantization tail (Cast, the scale Muls) are protected; the float ops are not."""
    g = ir.load(quantized("llama", "qdyn")).graph
    by_op: dict[str, list] = {}
    for n in g:
        by_op.setdefault(n.op_type, []).append(Q.protected(n))
    assert all(by_op["MatMulInteger"]) and all(by_op["DynamicQuantizeLinear"])
    tail_casts = [Q.protected(n) for n in g if n.op_type == "Cast" and n.inputs[0].producer() is not None
                  and n.inputs[0].producer().op_type == "MatMulInteger"]
    assert tail_casts and all(tail_casts)
    scale_muls = [n for n in g if n.op_type == "Mul" and any(
        v.producer() is not None and v.producer().op_type == "Cast" and v.producer().inputs[0].producer() is not None
        and v.producer().inputs[0].producer().op_type == "MatMulInteger" for v in n.inputs)]
    assert scale_muls and all(Q.protected(n) for n in scale_muls)
    for op in ("Pow", "ReduceMean", "Softmax", "Sigmoid", "Neg"):
        assert not any(by_op.get(op, [])), op


def test_a_qdq_node_unit_is_protected_and_a_dequantized_transpose_is_not():
    def qdq(x):
        return [helper.make_node("QuantizeLinear", [x, "s"], [x + "_q"]),
                helper.make_node("DequantizeLinear", [x + "_q", "s"], [x + "_dq"], name="dq_" + x)]
    nodes = [*qdq("a"), *qdq("b"),
             helper.make_node("Add", ["a_dq", "b_dq"], ["sum"], name="add"),
             helper.make_node("QuantizeLinear", ["sum", "s"], ["sum_q"]),
             helper.make_node("Transpose", ["a_dq"], ["t"], perm=[1, 0], name="t")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 2]) for x in "ab"],
                          [helper.make_tensor_value_info("sum_q", TensorProto.UINT8, [2, 2]),
                           helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 2])],
                          initializer=[numpy_helper.from_array(np.array(0.1, np.float32), "s")])
    model = ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    node = {n.name: n for n in model.graph}
    assert "QDQ node unit" in Q.protected(node["add"])
    assert Q.protected(node["t"]) is None  # ONNX Runtime runs DequantizeLinear -> Transpose in float either way


# --- bad input: a quantization ONNX Runtime's CPU provider cannot run ---------------------------------------

def _nbits_model(bits: int, block: int, k: int = 64, n: int = 8):
    blob = np.zeros((n, k // block, (block * bits + 7) // 8), np.uint8)
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("MatMulNBits", ["r", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                          block_size=block, name="q_proj")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
        initializer=[numpy_helper.from_array(blob, "w"),
                     numpy_helper.from_array(np.ones(n * k // block, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _fp4_model():
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq_fp4"),
         helper.make_node("MatMul", ["x", "wf"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT4E2M1, [4, 4], [0] * 16),
                     numpy_helper.from_array(np.array(1.0, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 11
    return m


@pytest.mark.parametrize("model,named", [
    pytest.param(lambda: _nbits_model(3, 32), ["com.microsoft:MatMulNBits 'q_proj'", "bits=3", "Only 2b, 4b and 8b",
                                               "its CPU kernels take T1 in {float, float16}"], marks=needs_nbits),
    pytest.param(lambda: _nbits_model(4, 8), ["'q_proj'", "block_size=8", "block sizes >= 16"], marks=needs_nbits),
    (_fp4_model, ["DequantizeLinear 'dq_fp4'", "input types float4e2m1", "T1 in {uint8, int8"]),
])
def test_a_quantization_onnx_runtime_cannot_run_is_refused_up_front(tmp_path, capsys, model, named):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model(), src)
    code = main(["--input", str(src), "--output", str(out), "--no-calibrate"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith("graph-autofusion: error:") and "cannot run the input's quantization on this CPU" in err[0]
    for phrase in named:
        assert phrase in err[0], phrase
    assert "verification failed" not in err[0] and ".cc:" not in err[0]  # no C++ source location


@needs_nbits
def test_a_runnable_quantization_has_no_failures(tmp_path):
    assert quantization_failures(ir.from_proto(_nbits_model(4, 32))) == []


# --- verification of a model that quantizes activations: the quantization floor ------------------------------

def _static_qdq(scale_op: str, scale: float, k: int = 32, n: int = 16):
    """x -> a = (Floor(8 x) + 0.5) {scale_op} {scale} -> QuantizeLinear(step 1/8) -> DequantizeLinear -> MatMul(W).
    With Div 8, every element of a lies exactly on a rounding boundary of the quantizer (half a step): any
    rewrite that changes a in its last bit moves elements by a whole step, as a fusion upstream of a model's
    activation quantizers can."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Mul", ["x", "eight"], ["x8"]), helper.make_node("Floor", ["x8"], ["f"]),
             helper.make_node("Add", ["f", "half"], ["fh"]), helper.make_node(scale_op, ["fh", "c"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "step", "zp"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "step", "zp"], ["adq"]),
             helper.make_node("MatMul", ["adq", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
             (("eight", 8.0), ("half", 0.5), ("c", scale), ("step", 0.125))]
    inits += [numpy_helper.from_array(np.array(0, np.int8), "zp"),
              numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_a_rounding_level_rewrite_of_a_quantized_activation_passes_by_the_quantization_floor():
    original = _static_qdq("Div", 8.0)
    last_bit = _static_qdq("Mul", float(np.float32(0.125) * np.float32(1 + 2 ** -23)))  # 1 ulp above 1/8
    strict = V.verify(original, last_bit, atol=1e-4, rtol=1e-3)  # explicit tolerances: no floor
    assert not strict.ok and strict.failed[0].quantization_floor is None
    r = V.verify(original, last_bit)
    assert r.ok and "quantization floor" in r.floor_note
    y = r.outputs[0]
    assert y.max_abs_diff > 1e-2 and y.quantization_floor >= 1e-2
    assert "within the input's quantization floor" in y.reason


def test_a_wrong_rewrite_of_a_quantized_model_still_fails_above_the_floor():
    r = V.verify(_static_qdq("Div", 8.0), _static_qdq("Div", 7.0))  # a wrong constant: every element moves
    assert not r.ok and "above the input's quantization floor" in r.failed[0].reason


def test_a_float_model_has_no_quantization_floor(exported):
    proto = onnx.load(exported("llama"))
    assert V.activation_quantizers(proto) == []
    assert isinstance(V.quantization_floor(exported("llama"), [], {}, []), str)
