"""Fuzz: graph-autofusion on broken and unusual ONNX files.

Each generated input ends in exit 0 (a verified fused model), 1 (verification failed,
nothing written) or 2 (one-line error, nothing written) -- never a traceback. The
input files are never changed, and nothing is written outside the output folder.
Seeded and bounded (the first mutations are byte-level, cheap; protobuf-level ones
load and run in ONNX Runtime).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superkernel.onnx.cli import main as graph_autofusion

SEED = 11


def _base_model(opset: int = 17, hidden: int = 16) -> onnx.ModelProto:
    """x + y -> LayerNormalization -> MatMul + bias -> Relu: fusable and small."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"], name="add"),
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5, name="ln"),
        helper.make_node("MatMul", ["n", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["mb"], name="bias"),
        helper.make_node("Relu", ["mb"], ["out"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, hidden])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, hidden])
    graph = helper.make_graph(nodes, "fuzz", [x, y], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run(tmp: Path, model_path: Path, *extra: str) -> tuple[int, str]:
    out_dir = tmp / "out"
    out_dir.mkdir(exist_ok=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(["--input", str(model_path), "--output", str(out_dir / "fused.onnx"), "--quiet",
                                 *extra])
    return code, err.getvalue()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_outcome(tmp: Path, inputs: list[Path], before: dict[Path, str], code: int, err: str) -> None:
    assert code in (0, 1, 2), f"exit {code}: {err[-500:]}"
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        assert "graph-autofusion: error:" in err, err[-500:]
    for path in inputs:
        assert _digest(path) == before[path], f"input {path.name} was changed"
    stray = [p for p in tmp.rglob("*") if p.is_file() and p not in inputs and p.parent != tmp / "out"]
    assert not stray, f"files written outside the output folder: {stray}"
    if code != 0:
        assert not (tmp / "out" / "fused.onnx").exists(), "a failed run wrote its output"


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        buf = buf[: rng.randrange(len(buf))]
    elif kind == 2:
        i = rng.randrange(len(buf))
        buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    else:
        i, j = sorted(rng.randrange(len(buf)) for _ in range(2))
        del buf[i:j]
    return bytes(buf)


def test_fuzz_byte_mutations(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    base = _base_model().SerializeToString()
    outcomes: dict[int, int] = {}
    for case in range(150):
        tmp = tmp_path / f"b{case}"
        tmp.mkdir()
        path = tmp / "model.onnx"
        path.write_bytes(_mutate_bytes(rng, base))
        before = {path: _digest(path)}
        code, err = _run(tmp, path, "--fusion-rules", "all")
        _check_outcome(tmp, [path], before, code, err)
        outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(2, 0) > 10  # most byte damage is refused as bad input


def _mutate_proto(rng: random.Random) -> onnx.ModelProto:
    model = _base_model(opset=rng.choice([11, 13, 14, 17, 18, 20, 23]))
    graph = model.graph
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        if kind == 0 and graph.initializer:                 # drop a weight
            del graph.initializer[rng.randrange(len(graph.initializer))]
        elif kind == 1:                                     # symbolic or odd dims
            vi = rng.choice(list(graph.input) + list(graph.output))
            dim = rng.choice(vi.type.tensor_type.shape.dim)
            choice = rng.randrange(3)
            if choice == 0:
                dim.dim_param = rng.choice(["batch", "seq", "", "N"])
            elif choice == 1:
                dim.dim_value = rng.choice([0, 1, 3, 10**6])
            else:
                dim.Clear()
        elif kind == 2:                                     # strip every shape (legacy exports carry none)
            for vi in list(graph.input) + list(graph.output):
                vi.type.tensor_type.ClearField("shape")
            del graph.value_info[:]
        elif kind == 3:                                     # unknown or wrong op
            node = rng.choice(graph.node)
            node.op_type = rng.choice(["Foo", "Relu", "Sub", "Gelu", "LayerNormalization"])
        elif kind == 4:                                     # dangling edge
            node = rng.choice(graph.node)
            node.input[rng.randrange(len(node.input))] = rng.choice(["missing", "", "out"])
        elif kind == 5:                                     # dtype change
            vi = rng.choice(list(graph.input))
            vi.type.tensor_type.elem_type = rng.choice([TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64,
                                                        TensorProto.BFLOAT16, 0])
        elif kind == 6:                                     # opset domain oddities
            model.opset_import.append(helper.make_opsetid(rng.choice(["com.microsoft", "ai.onnx.ml", "x"]),
                                                          rng.choice([1, 3])))
        elif kind == 7:                                     # attribute damage
            node = next(n for n in graph.node if n.op_type == "LayerNormalization") \
                if any(n.op_type == "LayerNormalization" for n in graph.node) else rng.choice(graph.node)
            del node.attribute[:]
            node.attribute.append(helper.make_attribute(rng.choice(["axis", "epsilon", "bogus"]),
                                                        rng.choice([0, -1, 5, 1e-3, "s"])))
        elif kind == 8:                                     # duplicate node names / outputs
            node = rng.choice(graph.node)
            graph.node.append(helper.make_node("Identity", [node.output[0]], [node.output[0]], name=node.name))
        else:                                               # initializer with a wrong shape
            if graph.initializer:
                init = rng.choice(graph.initializer)
                arr = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(np.ones(arr.size + 1, dtype=arr.dtype), init.name))
    return model


def test_fuzz_proto_mutations(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    outcomes: dict[int, int] = {}
    for case in range(70):
        tmp = tmp_path / f"p{case}"
        tmp.mkdir()
        path = tmp / "model.onnx"
        path.write_bytes(_mutate_proto(rng).SerializeToString())
        before = {path: _digest(path)}
        code, err = _run(tmp, path, "--opt-level", str(rng.randint(0, 3)))
        _check_outcome(tmp, [path], before, code, err)
        outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(0, 0) >= 1 and outcomes.get(2, 0) >= 1, outcomes


def _external_model(tmp: Path) -> tuple[Path, Path]:
    model = _base_model()
    path = tmp / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.onnx.data", size_threshold=0)
    return path, tmp / "ext.onnx.data"


@pytest.mark.parametrize("target", ["ext.onnx.data", "ext.onnx", "./ext.onnx.data"])
def test_output_may_not_name_any_input_file(tmp_path: Path, target: str) -> None:
    path, data = _external_model(tmp_path)
    before = {path: _digest(path), data: _digest(data)}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(["--input", str(path), "--output", str(tmp_path / target), "--quiet"])
    assert code == 2, err.getvalue()
    assert "graph-autofusion: error:" in err.getvalue()
    assert {p: _digest(p) for p in before} == before


def test_report_may_not_name_the_external_data(tmp_path: Path) -> None:
    path, data = _external_model(tmp_path)
    before = {path: _digest(path), data: _digest(data)}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(["--input", str(path), "--output", str(tmp_path / "o.onnx"), "--quiet",
                                 "--report", str(data)])
    assert code == 2 and "--report" in err.getvalue(), err.getvalue()
    assert {p: _digest(p) for p in before} == before
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("flag", ["--output", "--report"])
def test_unwritable_output_is_refused_before_work(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "m.onnx"
    onnx.save_model(_base_model(), str(path))
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    args = {"--output": str(tmp_path / "o.onnx"), "--report": None}
    args[flag] = str(blocked / "x.out")  # a path below a regular file can never be created
    argv = ["--input", str(path), "--output", args["--output"], "--quiet"]
    if args["--report"]:
        argv += ["--report", args["--report"]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(argv)
    assert code == 2, err.getvalue()
    assert "Traceback" not in err.getvalue() and flag in err.getvalue(), err.getvalue()
    assert not (tmp_path / "o.onnx").exists()


def test_model_and_external_data_appear_together_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    """If moving the model into place fails after its external data moved, both old files come back."""
    import onnx_ir as ir

    from superkernel.onnx import modelio

    out = tmp_path / "o.onnx"
    out.write_bytes(b"old model")
    (tmp_path / "o.onnx.data").write_bytes(b"old data")
    staged = modelio.stage_model(ir.from_proto(_base_model()), str(out), external_data=True)
    real_replace = modelio.os.replace

    def failing_replace(src, dst):
        if str(dst) == str(out) and ".graph-autofusion-" in str(src) and "previous" not in str(src):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(modelio.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        staged.commit()
    assert out.read_bytes() == b"old model"
    assert (tmp_path / "o.onnx.data").read_bytes() == b"old data"
    monkeypatch.setattr(modelio.os, "replace", real_replace)
    staged = modelio.stage_model(ir.from_proto(_base_model()), str(out), external_data=True)
    assert staged.commit() == [str(out), str(out) + ".data"]
    assert onnx.load(str(out)).graph.node[0].op_type == "Add"
    staged.discard()


def test_a_report_that_cannot_be_written_leaves_nothing_written(tmp_path: Path, monkeypatch) -> None:
    """The report is written before the model moves into place: if it fails, exit 2 and no model."""
    from superkernel.onnx import cli

    path = tmp_path / "m.onnx"
    onnx.save_model(_base_model(), str(path))
    real = cli.atomic_write

    def failing(target, *args, **kwargs):
        if str(target).endswith(".md"):
            raise OSError(28, "No space left on device")
        return real(target, *args, **kwargs)

    monkeypatch.setattr(cli, "atomic_write", failing)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(["--input", str(path), "--output", str(tmp_path / "o.onnx"), "--quiet",
                                 "--report", str(tmp_path / "r.md")])
    assert code == 2 and "--report: cannot write" in err.getvalue() and "nothing written" in err.getvalue()
    assert not (tmp_path / "o.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("flag", ["--bench-warmup", "--threads"])
def test_negative_counts_are_rejected(tmp_path: Path, flag: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion(["--input", "x.onnx", "--output", str(tmp_path / "o.onnx"), flag, "-1"])
    assert code == 2 and f"{flag} must be >= 0" in err.getvalue()
