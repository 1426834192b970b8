"""Precompiled frames: a fresh process runs the compiled function without Dynamo tracing it."""

from __future__ import annotations

import shutil

import pytest
import torch

from superkernel.static_kernel import frame_keys, frames
from superkernel.static_kernel.package import find_packages, read_manifest

from .conftest import HERE, parse_child, run_child


# Every child here that uses the fixture's package runs as local rank 0 of the two-process job that built it:
# a package records its rank layout, and one built for LOCAL_WORLD_SIZE 2 is not loaded in a layout of 1.
LAYOUT = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}


@pytest.fixture(scope="module")
def built_fn(tmp_path_factory):
    """Two processes (local ranks 0 and 1) compile a function closing over the model (batch 2) into one
    build dir: one builds the package, the other waits and loads it. The builder's package and output are
    what the other tests here load (one build serves both the two-process test and the frame tests)."""
    tmp = tmp_path_factory.mktemp("frames")
    build_dir = tmp / "build"
    build_dir.mkdir()
    # (no fresh-process load check in the build: the tests below load the package in fresh processes; the check
    # itself is test_build_and_load.py's)
    procs = [run_child(tmp, build_dir, 2, tmp / f"p{i}.pt", "--function", background=True,
                       LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(i), SUPERKERNEL_STATIC_VERIFY="0") for i in range(2)]
    results = [parse_child(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in procs]
    builders = [i for i, r in enumerate(results) if r["static"].get("compiled", 0) > 0]
    builder = builders[0] if builders else 0
    return {"tmp": tmp, "build_dir": build_dir, "results": results, "result": results[builder],
            "out": tmp / f"p{builder}.pt"}


def test_two_processes_one_build_dir(built_fn):
    """Moved here from test_build_and_load.py: its build is the package the frame tests load."""
    build_dir, tmp, results = built_fn["build_dir"], built_fn["tmp"], built_fn["results"]
    packages = find_packages(build_dir)
    assert len(packages) == 1
    builders = [r for r in results if r["static"].get("compiled", 0) > 0]
    loaders = [r for r in results if r["static"].get("loaded", 0) > 0 and r["static"].get("compiled", 0) == 0]
    assert len(builders) == 1 and len(loaders) == 1
    assert loaders[0]["cpp_builds"] == 0
    assert builders[0]["static"]["frames_built"] == 1  # the waiting process gets the frame too
    assert loaders[0]["static"]["frames_loaded"] == 1 and loaders[0]["dynamo_traces"] == 0
    assert builders[0]["packages"] == [str(packages[0])]
    assert not list(build_dir.rglob("*.tmp"))  # no half-written files left behind
    y0, y1 = torch.load(tmp / "p0.pt")["y"], torch.load(tmp / "p1.pt")["y"]
    assert torch.equal(y0, y1)


def test_build_stores_one_frame_with_its_sources(built_fn):
    result = built_fn["result"]
    assert result["static"]["frames_built"] == 1 and result["static"]["compiled"] >= 2
    assert result["notices"] == [] and result["warnings"] == []
    (path,) = find_packages(built_fn["build_dir"])
    pkg = read_manifest(path)
    pkg.verify()
    (key,) = pkg.frames
    entry = pkg.frames[key]
    assert entry["file"] == f"frames/{key}.bin" and entry["function"] == "__main__.main.<locals>.step"
    assert entry["level"] == "aten"  # an inference graph with nothing for AOTAutograd's wrapper to do
    assert "__main__" in entry["sources"] and "torch.nn.modules.linear" in entry["sources"]
    assert frame_keys.stale_sources({"torch.nn.modules.linear": entry["sources"]["torch.nn.modules.linear"]}) == []
    assert '"tensor": {"shape": [2, 32]' in entry["inputs"]
    assert pkg.frame_bytes(key)


def test_fresh_process_loads_the_frame_and_never_traces(built_fn):
    tmp = built_fn["tmp"]
    result = run_child(tmp, built_fn["build_dir"], 2, tmp / "load_out.pt", "--function", **LAYOUT)
    assert result["static"].get("frames_loaded") == 1 and result["static"]["loaded"] >= 2, result
    assert result["dynamo_traces"] == 0, "a loaded frame must not run Dynamo's tracer"
    assert result["aot_captures"] == 0, "an ATen-level frame must not run AOTAutograd"
    assert result["cpp_builds"] == 0 and result["static"].get("compiled", 0) == 0
    assert result["packages"] == [] and result["warnings"] == []
    built, loaded = torch.load(built_fn["out"]), torch.load(tmp / "load_out.pt")
    assert torch.equal(built["y"], loaded["y"]) and torch.equal(loaded["y"], loaded["y2"])
    torch.testing.assert_close(loaded["y"], loaded["eager"], rtol=1e-4, atol=1e-5)


def test_inputs_the_guards_reject_run_the_normal_path(built_fn):
    tmp = built_fn["tmp"]
    result = run_child(tmp, built_fn["build_dir"], 2, tmp / "guard_out.pt", "--function", "--then-batch", "3",
                       **LAYOUT)
    assert result["static"]["frames_loaded"] == 1
    assert result["dynamo_traces"] >= 1  # batch 3 is not in the package: traced here
    assert result["static"]["fallback"] >= 1 and len(find_packages(built_fn["build_dir"])) == 1
    assert any("no precompiled frame" in n and "differing: argument shapes" in n for n in result["notices"])
    out = torch.load(tmp / "guard_out.pt")
    torch.testing.assert_close(out["y3"], out["eager3"], rtol=1e-4, atol=1e-5)


def test_changed_source_makes_the_frame_stale(built_fn):
    tmp = built_fn["tmp"]
    edited = tmp / "edited" / "_child.py"
    edited.parent.mkdir()
    shutil.copy(HERE / "_child.py", edited)
    with edited.open("a") as f:
        f.write("\n# edited after the package was built\n")
    result = run_child(tmp, built_fn["build_dir"], 2, tmp / "stale_out.pt", "--function", script=edited, **LAYOUT)
    assert result["static"].get("frames_loaded", 0) == 0
    assert len(result["warnings"]) == 1 and "out of date" in result["warnings"][0]
    assert "__main__" in result["warnings"][0]
    assert result["dynamo_traces"] >= 1 and result["static"]["loaded"] >= 2  # partitions still load
    out = torch.load(tmp / "stale_out.pt")
    torch.testing.assert_close(out["y"], out["eager"], rtol=1e-4, atol=1e-5)


def test_graph_break_gives_a_notice_and_a_partition_package(tmp_path):
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    # (the fresh-process load check of a written package is covered by the fixtures' packages, which
    # fresh processes then load without compiling)
    result = run_child(tmp_path, build_dir, 2, tmp_path / "gb_out.pt", "--function", "--graph-break",
                       SUPERKERNEL_STATIC_VERIFY="0")
    assert result["static"]["frames_unsupported"] == 1 and result["static"].get("frames_built", 0) == 0
    assert len(result["notices"]) == 1 and "cannot be precompiled as one frame" in result["notices"][0]
    assert "graph_break" in result["notices"][0]
    (path,) = find_packages(build_dir)
    pkg = read_manifest(path)
    assert pkg.frames == {} and len(pkg.artifacts) >= 2
    out = torch.load(tmp_path / "gb_out.pt")
    torch.testing.assert_close(out["y"], out["eager"], rtol=1e-4, atol=1e-5)


def test_frame_key_follows_code_inputs_config_and_structure():
    lin = torch.nn.Linear(4, 4)

    def make(module):
        def f(x):
            return module(x)
        return f

    x = torch.randn(2, 4)
    base = frame_keys.frame_key(make(lin), (x,), {}, "cfg")
    assert base == frame_keys.frame_key(make(lin), (x,), {}, "cfg")  # another closure, same structure
    assert base != frame_keys.frame_key(make(lin), (torch.randn(3, 4),), {}, "cfg")
    assert base != frame_keys.frame_key(make(lin), (x.double(),), {}, "cfg")
    assert base != frame_keys.frame_key(make(lin), (x,), {}, "other-config")
    assert base != frame_keys.frame_key(make(torch.nn.Linear(4, 8)), (x,), {}, "cfg")
    assert base != frame_keys.frame_key(make(torch.nn.Sequential(lin)), (x,), {}, "cfg")

    def g(x):
        return lin(x) * 2

    assert frame_keys.frame_key(g, (x,), {}, "cfg") != frame_keys.frame_key(make(lin), (x,), {}, "cfg")
    assert set(frame_keys.external_objects(make(lin))) == {"closure:module"}


GLOBAL_MODEL = torch.nn.Linear(4, 4)
GLOBAL_SCALE = 2.0


def _uses_globals(x):
    return torch.relu(GLOBAL_MODEL(x)) * GLOBAL_SCALE


def test_module_globals_are_external_not_serialized():
    ext = frame_keys.external_objects(_uses_globals)
    assert ext == {"global:GLOBAL_MODEL": GLOBAL_MODEL}  # torch (a module) and the float stay with torch


def _recording_backend(tmp_path):
    """A superkernel backend with static kernels on in reduce-overhead mode with the flat program (``cpu.native``
    off: nothing is compiled, fast; frames are the subject here, packaged native modules test_ro_frames.py's)."""
    import superkernel

    cfg = superkernel.CompilerConfig()
    cfg.mode = "reduce-overhead"
    cfg.cpu.native = False
    cfg.experimental_config.static_kernel.enable = True
    cfg.experimental_config.static_kernel.build_dir = str(tmp_path)
    return superkernel.get_backend(cfg)


def test_aten_frame_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    cache = torch.zeros(4, 8)

    def step(x):
        cache[0].add_(x[0])  # an input mutation AOTAutograd keeps inside the graph
        return torch.relu(lin(x)) + cache.sum()

    x = torch.randn(4, 8)
    with torch.no_grad():
        aot_fn = frames.precompile(step, _recording_backend(tmp_path), (x,), {})
        assert frames.frame_level(aot_fn) == "aten"
        data = frames.serialize(aot_fn, step)
        cache.zero_()
        expected = step(x)
        cache.zero_()
        loaded = frames.load(data, step, _recording_backend(tmp_path))
        accepted, out = frames.call(loaded, (x,), {})
    assert accepted and torch.equal(out, expected)
    assert torch.equal(cache[0], x[0])  # the mutation reached the live tensor, not a copy
    accepted, _ = frames.call(loaded, (torch.randn(5, 8),), {})
    assert not accepted  # another shape: the guards send it to the normal path


@pytest.mark.parametrize("case,why", [
    ("alias", "outputs alias inputs"),
    ("grad", "training graph"),
])
def test_frames_keep_dynamo_graph_when_aotautograd_wraps_the_call(tmp_path, case, why, caplog):
    import logging

    lin = torch.nn.Linear(8, 8)
    if case == "alias":
        def step(x):
            return x.view(-1), lin(x)
        context = torch.no_grad()
    else:
        def step(x):
            return lin(x)
        context = torch.enable_grad()
    x = torch.randn(4, 8)
    with context, caplog.at_level(logging.INFO, logger="superkernel.static_kernel"):
        aot_fn = frames.precompile(step, _recording_backend(tmp_path), (x,), {})
    assert frames.frame_level(aot_fn) == "dynamo"
    assert any(why in r.getMessage() for r in caplog.records)


def test_graph_reading_attributes_is_refused():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))  # weights as get_attr nodes
    with pytest.raises(frames.FrameUnsupported, match="attributes"):
        frames._dump_graph(gm, frames.DYNAMO_META)


def test_signature_difference_names_what_differs():
    x = torch.randn(2, 4)
    with torch.no_grad():
        built = frame_keys.call_signature((x,), {})
        other_shape = frame_keys.call_signature((torch.randn(3, 4),), {})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        with torch.no_grad():
            more_threads = frame_keys.call_signature((x,), {})
    finally:
        torch.set_num_threads(threads)
    with torch.enable_grad():
        grad_on = frame_keys.call_signature((x,), {})
    assert frame_keys.signature_difference(built, other_shape) == "argument shapes, dtypes or values"
    assert frame_keys.signature_difference(built, more_threads) == f"torch threads ({threads} in the package, {threads + 1} here)"
    assert frame_keys.signature_difference(built, grad_on) == "grad mode (off in the package, on here)"


def test_frame_of_a_function_using_a_global_model_round_trips(tmp_path):
    x = torch.randn(3, 4)
    with torch.no_grad():
        aot_fn = frames.precompile(_uses_globals, _recording_backend(tmp_path), (x,), {})
        data = frames.serialize(aot_fn, _uses_globals)
        loaded = frames.load(data, _uses_globals, _recording_backend(tmp_path))
        accepted, out = frames.call(loaded, (x,), {})
        assert accepted and torch.equal(out, _uses_globals(x))
        GLOBAL_MODEL.weight.add_(1.0)  # the frame reads the live module, not a copy
        try:
            accepted, out = frames.call(loaded, (x,), {})
            assert accepted and torch.equal(out, _uses_globals(x))
        finally:
            GLOBAL_MODEL.weight.sub_(1.0)


def test_frames_of_models_scoped_by_apply_scopes_load_back(tmp_path):
    import superkernel

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).eval()
    superkernel.apply_scopes(model, {"blk": "0"})

    def step(x):
        return model(x)

    x = torch.randn(2, 8)
    key = frame_keys.frame_key(step, (x,), {}, "cfg")
    with torch.no_grad():
        aot_fn = frames.precompile(step, _recording_backend(tmp_path), (x,), {})
        data = frames.serialize(aot_fn, step)
        frames.check_loads(data, step)  # guards that reach into the scope wrapper's closure are not kept
        loaded = frames.load(data, step, _recording_backend(tmp_path))
        accepted, out = frames.call(loaded, (x,), {})
        assert accepted and torch.equal(out, model(x))
    # another plan is another frame: labels and options are part of the key
    superkernel.apply_scopes(model, {"other": "0"})
    assert frame_keys.frame_key(step, (x,), {}, "cfg") != key
    superkernel.apply_scopes(model, {"blk": "0"}, options="stream-fusion=1")
    assert frame_keys.frame_key(step, (x,), {}, "cfg") != key
    superkernel.apply_scopes(model, {"blk": "0"})
    assert frame_keys.frame_key(step, (x,), {}, "cfg") == key
    superkernel.remove_scopes(model)
    assert frame_keys.frame_key(step, (x,), {}, "cfg") != key


class _WithMethod(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def step(self, x):
        return torch.relu(self.lin(x)) * 3


def test_frame_of_a_bound_method_runs_on_another_instance(tmp_path):
    torch.manual_seed(0)
    built, other = _WithMethod().eval(), _WithMethod().eval()
    x = torch.randn(2, 8)
    assert set(frame_keys.external_objects(built.step)) == {"self"}
    with torch.no_grad():
        aot_fn = frames.precompile(built.step, _recording_backend(tmp_path), (x,), {})
        data = frames.serialize(aot_fn, built.step)
        loaded = frames.load(data, other.step, _recording_backend(tmp_path))
        accepted, out = frames.call(loaded, frame_keys.frame_args(other.step, (x,)), {})
    assert accepted and torch.equal(out, other.step(x)) and not torch.equal(out, built.step(x))


def test_a_frame_that_does_not_load_back_is_refused(tmp_path):
    lin = torch.nn.Linear(4, 4)

    def step(x):
        return lin(x)

    x = torch.randn(2, 4)
    with torch.no_grad():
        data = frames.serialize(frames.precompile(step, _recording_backend(tmp_path), (x,), {}), step)
    frames.check_loads(data, step)
    with pytest.raises(frames.FrameUnsupported, match="does not load back"):
        frames.check_loads(data[: len(data) // 2], step)
