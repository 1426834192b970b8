"""graph-autofusion end to end through main(argv): outputs, report, opt levels, filters,
--dim, --debug, external data, verification failure and every bad-input path."""

from __future__ import annotations

import json
import os
import shutil

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from superkernel.onnx.cli import main


def run(capsys, *argv, calibrate=False):
    """main(argv); the estimate decides unless ``calibrate`` (measured decisions depend on
    the machine, so tests that assert which fusions apply run without calibration)."""
    argv = [str(a) for a in argv]
    if not calibrate and "--input" in argv:
        argv.append("--no-calibrate")
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def ops(path):
    return [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]


def test_end_to_end_llama_with_report_and_benchmark(exported, tmp_path, capsys):
    out = tmp_path / "llama_fused.onnx"
    rep = tmp_path / "report.md"
    code, stdout, err = run(capsys, "--input", exported("llama"), "--output", out, "--fusion-rules", "all",
                            "--opt-level", "3", "--report", rep, "--benchmark", "--bench-repeat", "3",
                            "--bench-warmup", "1")
    assert code == 0, err
    assert out.exists()
    assert {"GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization"} <= set(ops(out))
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert "verification: passed" in stdout and "speedup vs ORT_ENABLE_ALL" in stdout
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "ok" and data["exit_code"] == 0
    assert data["verification"]["ok"] is True
    assert {c["rule"] for c in data["applied"]} >= {"rmsnorm", "skip_rmsnorm", "rotary", "gqa", "silu"}
    assert data["estimated_bytes_saved"] > 0 and data["node_count_saved"] > 0
    assert data["operators_found"]["MatMul"] >= 7
    cfgs = {(t["model"], t["level"]) for t in data["benchmark"]["timings"]}
    assert cfgs == {("original", "ORT_DISABLE_ALL"), ("original", "ORT_ENABLE_ALL"), ("fused", "ORT_ENABLE_ALL")}
    md = rep.read_text()
    for section in ("Operators found", "Fusions applied", "Candidates skipped", "Near misses", "Verification",
                    "Benchmark", "fusion candidates"):
        assert section in md


def test_list_rules(capsys):
    code, out, _ = run(capsys, "--list-rules")
    assert code == 0
    for name in ("layernorm", "rmsnorm", "skip_layernorm", "gelu_tanh", "bias_gelu", "fused_matmul_transpose",
                 "rotary", "gqa", "mha", "GroupQueryAttention"):
        assert name in out


def test_opt_level_0_validates_and_copies(exported, tmp_path, capsys):
    out = tmp_path / "copy.onnx"
    code, _, err = run(capsys, "--input", exported("bert"), "--output", out, "--opt-level", "0")
    assert code == 0, err
    assert ops(out) == ops(exported("bert"))


@pytest.mark.parametrize("level,present,absent", [
    (1, {"SkipLayerNormalization", "FastGelu"}, {"FusedMatMul", "MultiHeadAttention", "Attention"}),
    (2, {"SkipLayerNormalization", "FusedMatMul"}, {"MultiHeadAttention", "Attention"}),
    (3, {"SkipLayerNormalization", "Attention"}, {"Softmax"}),  # packed Q/K/V attention
])
def test_opt_levels(exported, tmp_path, capsys, level, present, absent):
    out = tmp_path / f"bert_{level}.onnx"
    code, _, err = run(capsys, "--input", exported("bert"), "--output", out, "--opt-level", level)
    assert code == 0, err
    got = set(ops(out))
    assert present <= got and not (absent & got), got


def test_fusion_rule_filter_excludes_rules(exported, tmp_path, capsys):
    out = tmp_path / "f.onnx"
    code, _, err = run(capsys, "--input", exported("llama"), "--output", out, "--fusion-rules", "all,-gqa,-rotary")
    assert code == 0, err
    got = set(ops(out))
    assert "GroupQueryAttention" not in got and "RotaryEmbedding" not in got and "SkipSimplifiedLayerNormalization" in got


def test_dim_changes_the_benefit_decision(exported, tmp_path, capsys):
    """Dynamic Llama: at the default estimate size (1) the rotary helpers cost more than the
    fusion saves; with realistic --dim values the same candidates are worth it."""
    small, big = tmp_path / "s.onnx", tmp_path / "b.onnx"
    code, _, err = run(capsys, "--input", exported("llama_dyn"), "--output", small, "--report", tmp_path / "s.md")
    assert code == 0, err
    data = json.loads((tmp_path / "s.json").read_text())
    skipped = [c for c in data["skipped"] if c["rule"] == "rotary"]
    assert skipped and all("net benefit not positive" in c["reason"] for c in skipped)
    assert data["unfixed_dims"] == ["batch", "seq"]
    code, _, err = run(capsys, "--input", exported("llama_dyn"), "--output", big, "--dim", "batch=1",
                       "--dim", "seq=256", "--report", tmp_path / "b.md")
    assert code == 0, err
    data = json.loads((tmp_path / "b.json").read_text())
    assert [c["rule"] for c in data["applied"]].count("rotary") == 2
    assert data["verification"]["inputs"]["hidden_states"] == [1, 256, 64]
    assert "RotaryEmbedding" in ops(big)


def test_debug_names_the_replaced_nodes(exported, tmp_path, capsys):
    out = tmp_path / "d.onnx"
    code, _, err = run(capsys, "--input", exported("bert"), "--output", out, "--debug")
    assert code == 0, err
    m = onnx.load(out)
    mha = [n for n in m.graph.node if n.op_type in ("MultiHeadAttention", "Attention")][0]
    props = {p.key: p.value for p in m.graph.node[list(m.graph.node).index(mha)].metadata_props}
    assert "Softmax" in mha.doc_string or "softmax" in props["superkernel.fused_from"]
    assert len(props["superkernel.fused_from"].split(",")) >= 10


def test_external_data_is_kept_next_to_the_output(exported, tmp_path, capsys):
    src = exported("llama_ext")
    assert os.path.exists(src + ".data")
    before = open(src, "rb").read(), open(src + ".data", "rb").read()
    out = tmp_path / "sub" / "ext_fused.onnx"
    out.parent.mkdir()
    code, _, err = run(capsys, "--input", src, "--output", out)
    assert code == 0, err
    assert (tmp_path / "sub" / "ext_fused.onnx.data").exists()
    locs = {e.value for t in onnx.load(out, load_external_data=False).graph.initializer for e in t.external_data
            if e.key == "location"}
    assert locs == {"ext_fused.onnx.data"}
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert (open(src, "rb").read(), open(src + ".data", "rb").read()) == before
    assert not [p for p in os.listdir(out.parent) if p.startswith(".graph-autofusion-")]


def test_verification_failure_writes_nothing(exported, tmp_path, capsys):
    out = tmp_path / "v.onnx"
    code, stdout, err = run(capsys, "--input", exported("llama"), "--output", out, "--atol", "0", "--rtol", "0",
                            "--report", tmp_path / "v.md")
    assert code == 1
    assert not out.exists()
    assert "verification failed" in err and "add_6" in err  # the offending output is named
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["written"] == [] and data["verification"]["ok"] is False
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".graph-autofusion-")]


def test_no_verify_skips_comparison(exported, tmp_path, capsys):
    out = tmp_path / "nv.onnx"
    code, stdout, _ = run(capsys, "--input", exported("ln_mlp"), "--output", out, "--no-verify", "--atol", "0",
                          "--rtol", "0")
    assert code == 0 and out.exists()
    assert "verification: not run" in stdout


# ------------------------------------------------------------------ bad input


def _bad(capsys, tmp_path, *argv, expect):
    out = tmp_path / "never.onnx"
    code, stdout, err = run(capsys, *argv[:2], "--output", out, *argv[2:])
    assert code == 2, (stdout, err)
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("graph-autofusion: error:"), err
    assert expect in lines[0], lines[0]
    assert not out.exists()
    return lines[0]


def test_missing_file(tmp_path, capsys):
    _bad(capsys, tmp_path, "--input", tmp_path / "nope.onnx", expect="not found")


def test_not_onnx(tmp_path, capsys):
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\n" * 20)
    _bad(capsys, tmp_path, "--input", p, expect="ONNX")


def test_truncated_protobuf(exported, tmp_path, capsys):
    data = open(exported("ln_mlp"), "rb").read()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    _bad(capsys, tmp_path, "--input", p, expect="truncated")


def _tiny_model(opset=18, bad=False):
    node = helper.make_node("Relu", ["missing" if bad else "x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_checker_failure(tmp_path, capsys):
    p = tmp_path / "bad.onnx"
    onnx.save(_tiny_model(bad=True), p)
    _bad(capsys, tmp_path, "--input", p, expect="checker failed")


@pytest.mark.parametrize("opset", [10, 99])
def test_unsupported_opset(tmp_path, capsys, opset):
    p = tmp_path / f"op{opset}.onnx"
    m = _tiny_model(opset=opset)
    onnx.save(m, p)
    _bad(capsys, tmp_path, "--input", p, expect=f"unsupported opset {opset}")


def test_no_rule_matching_the_filter(exported, tmp_path, capsys):
    _bad(capsys, tmp_path, "--input", exported("ln_mlp"), "--fusion-rules", "rotary", "--opt-level", "1",
         expect="no fusion rule")
    _bad(capsys, tmp_path, "--input", exported("ln_mlp"), "--fusion-rules", "flash", expect="unknown fusion rule")


def test_same_path_as_input_is_an_error(exported, tmp_path, capsys):
    src = tmp_path / "m.onnx"
    shutil.copy(exported("ln_mlp"), src)
    before = src.read_bytes()
    code, _, err = run(capsys, "--input", src, "--output", src)
    assert code == 2 and "refusing to write" in err and "it is an input of this run" in err
    assert src.read_bytes() == before


def test_output_paths_checked_before_any_work(exported, tmp_path, capsys):
    src = exported("ln_mlp")
    _bad(capsys, tmp_path, "--input", src, "--output", tmp_path, expect="is a directory")
    missing = tmp_path / "no" / "such" / "m.onnx"
    code, _, err = run(capsys, "--input", src, "--output", missing)
    assert code == 2 and "output directory does not exist" in err and not missing.parent.exists()
    # the external-data twin of the output (fused.onnx.data) may not replace a file of the input
    model = onnx.load(src)
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="fused.onnx.data",
              size_threshold=0)
    before = (tmp_path / "fused.onnx.data").read_bytes()
    code, _, err = run(capsys, "--input", tmp_path / "ext.onnx", "--output", tmp_path / "fused.onnx")
    assert code == 2 and "external data" in err and "it is an input of this run" in err, err
    assert (tmp_path / "fused.onnx.data").read_bytes() == before and not (tmp_path / "fused.onnx").exists()


def test_bad_dim_and_missing_arguments(exported, tmp_path, capsys):
    _bad(capsys, tmp_path, "--input", exported("ln_mlp"), "--dim", "seq", expect="NAME=VALUE")
    _bad(capsys, tmp_path, "--input", exported("ln_mlp"), "--dim", "seq=0", expect="positive")
    code, _, err = run(capsys, "--input", exported("ln_mlp"))
    assert code == 2 and "required" in err
    code, _, _ = run(capsys, "--input", exported("ln_mlp"), "--output", tmp_path / "x.onnx", "--opt-level", "7")
    assert code == 2


def test_bench_repeat_must_be_positive(capsys):
    from superkernel.onnx.cli import main

    assert main(["model.onnx", "--benchmark", "--bench-repeat", "0"]) == 2
    assert "--bench-repeat must be >= 1, got 0" in capsys.readouterr().err


def test_report_may_not_replace_the_output_or_the_input(exported, tmp_path, capsys):
    model = exported("ln_mlp")
    before = open(model, "rb").read()
    out = tmp_path / "fused.onnx"
    code, stdout, err = run(capsys, "--input", model, "--output", out, "--report", out)
    assert code == 2 and "refusing to write" in err and not out.exists(), (stdout, err)
    json_named_like_output = tmp_path / "fused.onnx.md"  # its JSON twin is fused.onnx.json: fine
    code, stdout, err = run(capsys, "--input", model, "--output", out, "--report", json_named_like_output)
    assert code == 0, (stdout, err)
    code, stdout, err = run(capsys, "--input", model, "--output", tmp_path / "again.onnx", "--report", model)
    assert code == 2 and "refusing to write" in err and "it is an input of this run" in err, (stdout, err)
    assert open(model, "rb").read() == before
