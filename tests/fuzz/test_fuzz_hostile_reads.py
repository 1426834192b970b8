"""Hostile environment, reads that never end: devices, FIFOs, alias bombs, deep nesting, huge constants.

Every file the tools read must be a regular file whose size is checked before reading, and
every parser runs with limits. The cases run in one child process per group, under an
address-space limit (RLIMIT_AS) with a per-case alarm; each case's peak memory is measured
on its own (the peak is reset before it, ``/proc/self/clear_refs``). A case passes when it
ends in the documented one-line error (or a valid result) quickly, with bounded memory,
and changed nothing outside its directory or in the current directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fuzz.hostile import Case, run_bounded

PEAK_GROWTH_MB = 400  # what one case may add to the child's resident memory
CASE_SECONDS = 30

# The child: run each case with its peak memory reset, an alarm against hangs, and record the outcome.
_HARNESS = """
import os, signal, traceback
def peak_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) / 1024
    return 0.0
def reset_peak():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False
class Hung(Exception):
    pass
def _alarm(*_):
    raise Hung()
signal.signal(signal.SIGALRM, _alarm)
result = {'cases': {}}
def run_case(name, fn, seconds):
    import gc
    gc.collect()
    resettable = reset_peak()
    base = peak_mb()
    signal.alarm(seconds)
    outcome = {}
    try:
        outcome['value'] = fn()
    except Hung:
        outcome['hung'] = True
    except BaseException as exc:
        outcome['error_type'] = type(exc).__name__
        outcome['error'] = str(exc)[:3000]
        outcome['error_len'] = len(str(exc))
        outcome['traceback'] = traceback.format_exc()[-1500:]
    finally:
        signal.alarm(0)
    outcome['growth_mb'] = (peak_mb() - base) if resettable else None
    result['cases'][name] = outcome
"""


def _check(outcomes: dict, expected_errors: tuple[str, ...]) -> None:
    for name, o in outcomes.items():
        assert not o.get("hung"), f"{name}: the read never ended (killed by the alarm)"
        assert o.get("error_type") in expected_errors, f"{name}: {o.get('error_type')}: {o.get('traceback', '')}"
        assert "\n" not in o["error"].strip() and o["error_len"] < 2000, f"{name}: error is not one short line"
        if o.get("growth_mb") is not None:
            assert o["growth_mb"] < PEAK_GROWTH_MB, f"{name}: memory grew by {o['growth_mb']:.0f} MB"


@pytest.fixture
def case(tmp_path, monkeypatch):
    c = Case(work=tmp_path / "work", outside=tmp_path / "outside", cwd=tmp_path / "cwd", marker=tmp_path / "PWNED")
    monkeypatch.chdir(c.cwd)
    yield c
    c.check()


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases expand to ``width ** levels`` values."""
    lines = ["a0: &a0 [" + ",".join(["xxxxxxxx"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nversion: 1\nmode: reduce-overhead\nscopes: {{attn: *a{levels - 1}}}\n"


def _endless(case: Case) -> dict[str, str]:
    fifo = case.work / "fifo"
    os.mkfifo(fifo)
    link = case.work / "zero_link"
    link.symlink_to("/dev/zero")
    return {"dev_zero": "/dev/zero", "dev_urandom": "/dev/urandom", "fifo": str(fifo), "link_to_dev_zero": str(link)}


def test_plan_files_that_never_end_or_explode(case):
    files = _endless(case)
    bomb = case.work / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    assert bomb.stat().st_size < 600
    deep_seq = case.work / "deep_seq.yaml"
    deep_seq.write_text("scopes: " + "[" * 5000 + "]" * 5000 + "\nmode: reduce-overhead\n")
    deep_map = case.work / "deep_map.yaml"
    deep_map.write_text("scopes: " + "{a: " * 3000 + "x" + "}" * 3000 + "\nmode: reduce-overhead\n")
    huge = case.work / "huge_value.yaml"
    huge.write_text("version: 1\nmode: '" + "\\x1b[2J" * 200000 + "'\nscopes: {a: m}\n")
    files.update(alias_bomb=str(bomb), deep_sequence=str(deep_seq), deep_mapping=str(deep_map), huge_value=str(huge))
    code = _HARNESS + f"""
from superkernel.tools.advisor.plan_file import read_plan
for name, path in {json.dumps(files)}.items():
    run_case(name, lambda p=path: str(read_plan(p)), {CASE_SECONDS})
"""
    out = run_bounded(code, mem_mb=2048, timeout=12 * CASE_SECONDS)
    assert out["rc"] == 0 and not out["hung"], out.get("stderr")
    _check(out["cases"], ("PlanFileError",))


def test_onnx_inputs_that_never_end(case):
    files = _endless(case)
    code = _HARNESS + f"""
import contextlib, io
from superkernel.onnx.cli import main
def cli(path, out):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(['--input', path, '--output', out, '--quiet', '--no-calibrate', '--no-verify'])
    raise SystemExit(f'exit {{code}}: ' + err.getvalue().strip())
for name, path in {json.dumps(files)}.items():
    run_case(name, lambda p=path: cli(p, {json.dumps(str(case.work / 'out.onnx'))}), {CASE_SECONDS})
"""
    out = run_bounded(code, mem_mb=3072, timeout=6 * CASE_SECONDS)
    assert out["rc"] == 0 and not out["hung"], out.get("stderr")
    _check(out["cases"], ("SystemExit",))
    for name, o in out["cases"].items():
        assert o["error"].startswith("exit 2: graph-autofusion: error:") and "Traceback" not in o["error"], (name, o)
    assert not (case.work / "out.onnx").exists()


def _constant_bomb(side: int) -> onnx.ModelProto:
    """A tiny model whose ConstantOfShape would be ``side * side`` float32 values once evaluated."""
    shape = numpy_helper.from_array(np.array([side, side], dtype=np.int64), "shape")
    nodes = [helper.make_node("Constant", [], ["s"], value=shape),
             helper.make_node("ConstantOfShape", ["s"], ["big"],
                              value=numpy_helper.from_array(np.array([1.0], dtype=np.float32), "v")),
             helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "bomb", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _range_bomb(n: int) -> onnx.ModelProto:
    """A tiny model whose Range would hold ``n`` int64 values (ONNX's data propagation evaluates it)."""
    inits = [numpy_helper.from_array(np.array(v, dtype=np.int64), name) for name, v in (("s", 0), ("l", n), ("d", 1))]
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Cast", ["r"], ["rf"], to=1),
             helper.make_node("ReduceSum", ["rf"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "bomb", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_constant_folding_sizes_before_evaluating(case):
    paths = {}
    for name, model in (("576MB", _constant_bomb(12000)), ("6.4GB", _constant_bomb(40000)),
                        ("range_1.2GB", _range_bomb(150_000_000))):
        p = case.work / f"bomb_{name}.onnx"
        onnx.save(model, str(p))
        assert p.stat().st_size < 300
        paths[name] = str(p)
    code = _HARNESS + f"""
import onnx_ir as ir
from superkernel.onnx import shapes
def annotate(p):
    notes = shapes.annotate(ir.load(p)).notes
    raise SystemExit('notes: ' + '; '.join(notes)[:200])
for name, path in {json.dumps(paths)}.items():
    run_case(name, lambda p=path: annotate(p), {CASE_SECONDS})
"""
    out = run_bounded(code, mem_mb=3072, timeout=4 * CASE_SECONDS)
    assert out["rc"] == 0 and not out["hung"], out.get("stderr")
    _check(out["cases"], ("SystemExit",))
    for name, o in out["cases"].items():
        assert "MemoryError" not in o["error"], (name, o["error"])


def test_checkpoint_configs_that_never_end_or_nest_too_deep(case, tmp_path_factory):
    from superkernel.tools.models.archs import save_checkpoint

    base = save_checkpoint("llama", tmp_path_factory.mktemp("hostile_ckpt") / "base", num_hidden_layers=1)
    dirs = {}
    for name in ("deep_list", "deep_object", "fifo", "link_to_dev_zero", "huge"):
        d = case.work / name
        d.mkdir()
        for f in base.iterdir():
            if f.name != "config.json":
                (d / f.name).symlink_to(f)
        cfg = d / "config.json"
        if name == "deep_list":
            cfg.write_text('{"model_type": "llama", "x": ' + "[" * 5000 + "]" * 5000 + "}")
        elif name == "deep_object":
            cfg.write_text('{"model_type": "llama", "x": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}")
        elif name == "fifo":
            os.mkfifo(cfg)
        elif name == "link_to_dev_zero":
            cfg.symlink_to("/dev/zero")
        else:
            cfg.write_text('{"model_type": "llama", "pad": "' + "x" * (64 << 20) + '"}')
        dirs[name] = str(d)
    code = _HARNESS + f"""
from superkernel.tools.models import load_model
for name, path in {json.dumps(dirs)}.items():
    run_case(name, lambda p=path: load_model(p), {CASE_SECONDS})
"""
    out = run_bounded(code, mem_mb=6144, timeout=8 * CASE_SECONDS)
    assert out["rc"] == 0 and not out["hung"], out.get("stderr")
    _check(out["cases"], ("ModelLoadError",))
    for d in dirs.values():
        for f in Path(d).iterdir():
            f.unlink()


def _fusable_bomb(kind: str) -> onnx.ModelProto:
    """``x @ W + b`` (a Gemm fusion, so the cleanup folding runs) plus one constant that would be huge."""
    side = np.array([40000, 40000], dtype=np.int64)
    inits = [numpy_helper.from_array(np.ones((16, 16), np.float32), "W"),
             numpy_helper.from_array(np.ones(16, np.float32), "b"),
             numpy_helper.from_array(side, "side"), numpy_helper.from_array(np.ones((1, 1), np.float32), "one")]
    big = {"expand": [helper.make_node("Expand", ["one", "side"], ["big"])],
           "tile": [helper.make_node("Tile", ["one", "side"], ["big"])],
           "broadcast": [helper.make_node("Add", ["col", "row"], ["big"])],
           "range": [helper.make_node("Range", ["r0", "r1", "r2"], ["big"])],
           "int64_constant_of_shape": [helper.make_node(
               "ConstantOfShape", ["side"], ["big"], value=numpy_helper.from_array(np.array([1], np.int64)))]}[kind]
    if kind == "broadcast":
        inits += [numpy_helper.from_array(np.ones((40000, 1), np.float32), "col"),
                  numpy_helper.from_array(np.ones((1, 40000), np.float32), "row")]
    if kind == "range":
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("r0", 0), ("r1", 800_000_000), ("r2", 1))]
    nodes = big + [helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
                   helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
                   helper.make_node("Mystery", ["x"], ["m"], domain="com.example"),  # symbolic inference runs
                   helper.make_node("Add", ["m", "sf"], ["xs"]),
                   helper.make_node("MatMul", ["xs", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    graph = helper.make_graph(nodes, "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                             ir_version=8)


def test_library_evaluators_size_constants_before_evaluating(case):
    """Every evaluator the ONNX tool hands constants to is given only results it sized first: ONNX Runtime's
    symbolic shape inference (an int64 ConstantOfShape), onnxscript's cleanup folding (Expand, Tile, Range,
    broadcasts) and the rules' ``eval_const``. A spy records what reaches the evaluators."""
    paths = {}
    for kind in ("expand", "tile", "broadcast", "range", "int64_constant_of_shape"):
        p = case.work / f"{kind}.onnx"
        onnx.save(_fusable_bomb(kind), str(p))
        paths[kind] = str(p)
    code = _HARNESS + f"""
import onnx_ir as ir
import onnxscript.optimizer._constant_folding as cf
from superkernel.onnx import _util as U, engine, shapes
evaluated = []
_evaluate, _reference_run = cf._reference_evaluator.evaluate, U.reference_run
def spy(domain, op, version, *args, **kwargs):
    evaluated.append(op)
    return _evaluate(domain, op, version, *args, **kwargs)
def spy_run(proto, feeds, opset):
    evaluated.append(proto.op_type)
    return _reference_run(proto, feeds, opset)
cf._reference_evaluator.evaluate, U.reference_run = spy, spy_run
BIG = {{"Expand", "Tile", "Range", "ConstantOfShape", "Add"}}
def bounded(path):
    del evaluated[:]
    model = ir.load(path)
    notes = shapes.annotate(model).notes               # ONNX and ONNX Runtime inference
    big = next(n for n in model.graph if n.outputs[0].name == "big").outputs[0]
    value = U.eval_const(big)                         # the rules' constant evaluation
    engine._cleanup(model)                            # onnxscript's folding after a fusion
    raise SystemExit("evaluated: " + ",".join(sorted(set(evaluated) & BIG)) + " | " + "; ".join(notes)[:300]
                     + (" | eval_const gave a value" if value is not None else ""))
for name, path in {json.dumps(paths)}.items():
    run_case(name, lambda p=path: bounded(p), {CASE_SECONDS})
"""
    out = run_bounded(code, mem_mb=3072, timeout=6 * CASE_SECONDS)
    assert out["rc"] == 0 and not out["hung"], out.get("stderr")
    _check(out["cases"], ("SystemExit",))
    bad = {name: o["error"] for name, o in out["cases"].items()
           if not o["error"].startswith("evaluated:  |") or "MemoryError" in o["error"]
           or "eval_const gave a value" in o["error"]}
    assert not bad, bad


def test_shape_inference_never_changes_the_working_directory(case, monkeypatch):
    """ONNX Runtime's symbolic inference saves a model into '.' when it gives up; it is driven so that it
    writes nothing, without changing the process's working directory (not thread-safe)."""
    import onnx_ir as ir

    from superkernel.onnx import shapes

    calls = []
    real_chdir = os.chdir
    monkeypatch.setattr(os, "chdir", lambda p: (calls.append(str(p)), real_chdir(p))[1])
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example"), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    ann = shapes.annotate(ir.from_proto(model))
    assert calls == [], f"the working directory was changed: {calls}"
    assert any("symbolic" in n for n in ann.notes), ann.notes  # it ran (and gave up) without a file
