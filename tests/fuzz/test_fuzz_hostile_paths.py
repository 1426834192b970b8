"""Hostile environment, paths: every path the tools write goes through one check.

Never an input file (external data included), never through a symlink or into a FIFO,
never into the current directory by accident (a library's temporary model goes to a
private temporary directory), and ``static-compile --clean`` never deletes through a link.
Each case checks that nothing outside its directory and nothing in the current directory
changed, and that no marker file appeared.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from superkernel.onnx.cli import main as graph_autofusion
from tests.fuzz.hostile import Case, FifoWatchdog, snapshot


@pytest.fixture
def case(tmp_path, monkeypatch):
    return Case.entered(tmp_path, monkeypatch)


def _fusable_model(hidden: int = 16) -> onnx.ModelProto:
    """x + y -> LayerNormalization -> MatMul: small, with a fusion to calibrate."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta"),
             numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w")]
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w"], ["out"])]
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, hidden]) for n in ("x", "y", "out")]
    graph = helper.make_graph(nodes, "hostile", io_[:2], io_[2:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _incomplete_model() -> onnx.ModelProto:
    """A custom operator whose output shape no inference knows: ONNX Runtime's symbolic shape
    inference gives up on it (and, left alone, saves its model into the current directory)."""
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example"), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                             ir_version=8)


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = graph_autofusion([*argv, "--quiet"])
    return code, err.getvalue()


def _save_external(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".weights", size_threshold=0)
    return path.with_name(path.name + ".weights")


@pytest.mark.parametrize("target", ["input", "external_data", "symlink_to_outside", "fifo"])
def test_calibration_cache_never_overwrites_an_input_or_goes_through_a_link(case, target):
    model = case.work / "m.onnx"
    data = _save_external(_fusable_model(), model)
    cache = {"input": model, "external_data": data, "symlink_to_outside": case.work / "link.json",
             "fifo": case.work / "cal.fifo"}[target]
    if target == "symlink_to_outside":
        cache.symlink_to(case.outside / "victim.txt")
    elif target == "fifo":
        os.mkfifo(cache)
    before = snapshot(case.work)
    with FifoWatchdog(cache) as watchdog:
        code, err = _run("--input", str(model), "--output", str(case.work / "fused.onnx"), "--calibration-cache",
                         str(cache), "--no-e2e-check")
    assert not watchdog.fired, "the run blocked reading a FIFO"
    assert code == 2 and "--calibration-cache" in err and "Traceback" not in err, (code, err[-800:])
    assert snapshot(case.work) == before, "a file of the run was changed"
    case.check(target)


def test_relative_calibration_cache_is_written_where_named(case):
    model = case.work / "m.onnx"
    onnx.save(_fusable_model(), str(model))
    code, err = _run("--input", str(model), "--output", str(case.work / "fused.onnx"), "--calibration-cache",
                     "cal.json", "--no-e2e-check", "--no-verify")
    assert code == 0, err[-800:]
    assert (case.cwd / "cal.json").is_file(), "a bare relative --calibration-cache was silently not written"
    os.unlink(case.cwd / "cal.json")
    case.check()


@pytest.mark.parametrize("planted", ["symlink_to_outside", "input_of_that_name", "nothing"])
def test_library_temp_files_never_land_in_the_current_directory(case, planted):
    name = "sym_shape_infer_temp.onnx"
    model = case.work / "in.onnx"
    if planted == "symlink_to_outside":
        (case.cwd / name).symlink_to(case.outside / "victim.txt")
    elif planted == "input_of_that_name":
        model = case.cwd / name
    onnx.save(_incomplete_model(), str(model))
    case.freeze_cwd()
    code, err = _run("--input", str(model), "--output", str(case.work / "out.onnx"), "--no-verify", "--no-calibrate")
    assert code in (0, 1, 2) and "Traceback" not in err, err[-800:]
    case.check(planted)


@pytest.mark.parametrize("flag", ["--output", "--report"])
@pytest.mark.parametrize("kind", ["fifo", "symlink_to_outside"])
def test_outputs_are_never_fifos_or_links(case, flag, kind):
    model = case.work / "m.onnx"
    onnx.save(_fusable_model(), str(model))
    target = case.work / ("out.onnx" if flag == "--output" else "report.md")
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(case.outside / "victim.txt")
    output = target if flag == "--output" else case.work / "fused.onnx"
    argv = ["--input", str(model), "--output", str(output), "--no-calibrate", "--no-verify"]
    if flag == "--report":
        argv += ["--report", str(target)]
    with FifoWatchdog(target) as watchdog:
        code, err = _run(*argv)
    assert not watchdog.fired, "the run blocked on a FIFO"
    assert code == 2 and "Traceback" not in err, (code, err[-800:])
    st = os.lstat(target)
    assert (stat.S_ISFIFO(st.st_mode) if kind == "fifo" else stat.S_ISLNK(st.st_mode)), "the target was replaced"
    case.check(f"{flag} {kind}")


@pytest.mark.parametrize("link", ["outputs_dir", "build_dir", "output_folder"])
def test_clean_never_deletes_through_a_link(case, link, capsys):
    from superkernel.static_kernel.package import OUTPUTS_DIR
    from superkernel.tools.static_compile import clean

    elsewhere = case.outside / "victim_dir"
    (elsewhere / "a_outputs").mkdir()
    (elsewhere / "a_outputs" / "static_kernel_x.skpkg").write_bytes(b"someone else's")
    case.freeze_cwd()
    case._before["outside"] = snapshot(case.outside)
    build = case.work / "build"
    if link == "outputs_dir":
        build.mkdir()
        (build / OUTPUTS_DIR).symlink_to(elsewhere)
    elif link == "build_dir":
        (case.outside / "victim_dir" / OUTPUTS_DIR).mkdir()
        ((case.outside / "victim_dir" / OUTPUTS_DIR) / "b_outputs").mkdir()
        case._before["outside"] = snapshot(case.outside)
        build.symlink_to(case.outside / "victim_dir")
    else:
        (build / OUTPUTS_DIR).mkdir(parents=True)
        (build / OUTPUTS_DIR / "c_outputs").symlink_to(elsewhere / "a_outputs")
    clean(build)
    capsys.readouterr()
    case.check(link)
