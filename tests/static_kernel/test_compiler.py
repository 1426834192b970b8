"""The static kernel compiler seam on a small ATen graph, in this process: keys, mismatches, corruption, CLI."""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from superkernel import CompilerConfig
from superkernel.static_kernel import BuildDirError, StaticKernelWarning, find_packages, partition_key, read_manifest
from superkernel.static_kernel import trust
from superkernel.static_kernel.compiler import open_compiler
from superkernel.tools import static_compile as static_cli
from superkernel.static_kernel.settings import ENV_REBUILD, RankLayoutError
from superkernel.static_kernel.workspace import reset_workspaces


def _fn(x, w, b):
    return (torch.relu(torch.mm(x, w) + b) * 3.0,)


def _graph(rows: int = 4):
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(rows, 16, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, generator=g)]
    gm = make_fx(_fn, tracing_mode="fake")(*inputs)
    return gm, inputs


#: Inductor's Python wrapper, not the default C++ one: these tests are about the package seam (keys, trust,
#: damage, rebuilds), and ~15 of them rebuild the partition; the C++ wrapper's -O3 build costs ~1 s more each.
#: Packages with the C++ wrapper are built and loaded by test_build_and_load.py, test_frames.py and the docs.
SEAM_INDUCTOR = {"cpp_wrapper": False}


def _config(build_dir: Path, **inductor) -> CompilerConfig:
    cfg = CompilerConfig()
    cfg.experimental_config.static_kernel.enable = True
    cfg.experimental_config.static_kernel.build_dir = str(build_dir)
    for k, v in {**SEAM_INDUCTOR, **inductor}.items():
        setattr(cfg.inductor, k, v)
    return cfg


def _never(*_a):
    raise AssertionError("the normal compile path must not run here")


def _run(cfg: CompilerConfig, rows: int = 4, compile_fn=_never):
    compiler = open_compiler(cfg)
    gm, inputs = _graph(rows)
    compiler.record_graph(gm, "graph_0")
    fn = compiler.compile(gm, inputs, compile_fn)
    out = fn(*inputs)
    compiler.finalize()
    return compiler, out, inputs


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    """One package (no fresh-process load check: that is covered end to end elsewhere)."""
    import os

    build_dir = tmp_path_factory.mktemp("pkg")
    os.environ["SUPERKERNEL_STATIC_VERIFY"] = "0"
    try:
        reset_workspaces()
        compiler, out, inputs = _run(_config(build_dir))
        reset_workspaces()
    finally:
        os.environ.pop("SUPERKERNEL_STATIC_VERIFY", None)
    assert compiler.counters["compiled"] == 1
    return build_dir


@pytest.fixture
def pkg_copy(package_dir, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("SUPERKERNEL_STATIC_VERIFY", "0")
    target = tmp_path / "build"
    shutil.copytree(package_dir, target)
    (pkg,) = find_packages(target)
    return target, pkg


def _rewrite(pkg: Path, edit_manifest=None, edit_file=None, *, sign: bool = True) -> None:
    """Edit a package in place; a changed manifest is re-signed with this user's key unless ``sign`` is False
    (the hashes are always recomputed: only the signature tells who built it)."""
    with zipfile.ZipFile(pkg) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    if edit_file:
        name = next(n for n in members if n.startswith("artifacts/"))
        members[name] = edit_file(members[name])
    if edit_manifest or not sign:
        manifest = json.loads(members["manifest.json"])
        manifest["files"] = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                             for n, d in members.items() if n not in ("manifest.json", "signature")}
        if edit_manifest:
            edit_manifest(manifest)
        members["manifest.json"] = json.dumps(manifest).encode()
        members["signature"] = trust.sign(members["manifest.json"]).encode() if sign else b"0" * 64
    with zipfile.ZipFile(pkg, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)


def test_partition_key_is_stable_and_shape_specific():
    gm1, in1 = _graph(4)
    gm2, in2 = _graph(4)
    gm3, in3 = _graph(5)
    k1 = partition_key(gm1, in1, "fp")
    assert k1 == partition_key(gm2, in2, "fp")
    assert k1 != partition_key(gm3, in3, "fp") and k1 != partition_key(gm1, in1, "other-config")
    assert partition_key(gm1, [torch.randn(4, 16).t().contiguous().t(), *in1[1:]], "fp") != k1  # strides count


def test_matching_package_loads_without_compiling(pkg_copy):
    build_dir, pkg = pkg_copy
    compiler, out, inputs = _run(_config(build_dir))
    assert compiler.counters["loaded"] == 1 and compiler.counters.get("compiled", 0) == 0
    torch.testing.assert_close(out[0], _fn(*inputs)[0])
    assert find_packages(build_dir) == [pkg]
    kernels = {Path(n).name for n in read_manifest(pkg).kernels}
    assert kernels and compiler.counters["kernels_installed"] == len(kernels)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    shared = {p.name for p in Path(cache_dir()).rglob("*")}
    assert not kernels & shared, "a package's kernels never go to the shared Inductor cache"


def test_the_seam_hash_load_compile(pkg_copy):
    """hash names a partition, load returns it from the package by that handle (None when not held)."""
    build_dir, pkg = pkg_copy
    compiler = open_compiler(_config(build_dir))
    gm, inputs = _graph(4)
    handle = compiler.hash(gm, inputs)
    assert handle == partition_key(gm, inputs, compiler.workspace("cpu").fingerprint)
    assert handle in read_manifest(pkg).artifacts and compiler.package.path == pkg
    fn = compiler.load(handle, gm, inputs)
    torch.testing.assert_close(fn(*inputs)[0], _fn(*inputs)[0])
    assert compiler.load("0" * 40, gm, inputs) is None
    other, other_inputs = _graph(5)
    assert compiler.hash(other, other_inputs) != handle
    assert compiler.compile(other, other_inputs, lambda: "normal path") == "normal path"  # not in the package
    assert compiler.counters["loaded"] == 1 and compiler.counters["fallback"] == 1


@pytest.mark.parametrize("what,edit,expect", [
    ("version", lambda m: m["environment"].update(torch="1.0.0"), "torch differs"),
    ("device", lambda m: m["environment"].update(device_capability="x86_64:sse4_2"), "device_capability differs"),
    ("config", lambda m: m.update(config_fingerprint="0000-0000"), "compiler config differs"),
    ("world size", lambda m: m["environment"].update(world_size="2", local_world_size="2"),
     "package built for world size 2, this job has world size 1"),
])
def test_mismatched_package_is_ignored_and_rebuilt(pkg_copy, what, edit, expect, monkeypatch):
    build_dir, pkg = pkg_copy
    if what == "world size":  # (another layout is rebuilt only when asked: static-compile --rebuild)
        monkeypatch.setenv(ENV_REBUILD, "1")
    _rewrite(pkg, edit_manifest=edit)
    with pytest.warns(StaticKernelWarning, match=expect):
        compiler, out, inputs = _run(_config(build_dir))
    assert compiler.counters["compiled"] == 1 and compiler.counters.get("loaded", 0) == 0
    torch.testing.assert_close(out[0], _fn(*inputs)[0])
    new = [p for p in find_packages(build_dir) if p != pkg]
    assert len(new) == 1 and read_manifest(new[0]).manifest["environment"]["torch"] == torch.__version__
    reset_workspaces()
    compiler, _, _ = _run(_config(build_dir))  # the rebuilt package is the one used next time
    assert compiler.counters["loaded"] == 1 and compiler.counters.get("compiled", 0) == 0


def test_another_world_size_is_an_error_unless_rebuilt(pkg_copy, monkeypatch):
    """A package that fits but for its world size, and no other: one error line naming both sizes; nothing built."""
    build_dir, pkg = pkg_copy
    monkeypatch.delenv(ENV_REBUILD, raising=False)
    _rewrite(pkg, edit_manifest=lambda m: m["environment"].update(world_size="2", local_world_size="2"))
    with pytest.raises(RankLayoutError) as info:
        _run(_config(build_dir))
    message = str(info.value)
    assert "package built for world size 2, this job has world size 1" in message and "--rebuild" in message
    assert "\n" not in message and find_packages(build_dir) == [pkg]


def test_other_compiler_config_does_not_use_the_package(pkg_copy):
    build_dir, pkg = pkg_copy
    with pytest.warns(StaticKernelWarning, match="compiler config differs"):
        compiler, out, inputs = _run(_config(build_dir, cpp_wrapper=True))
    assert compiler.counters["compiled"] == 1
    torch.testing.assert_close(out[0], _fn(*inputs)[0])


def test_corrupted_package_is_detected_replaced_and_kept_aside(pkg_copy):
    build_dir, pkg = pkg_copy
    _rewrite(pkg, edit_file=lambda data: data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    with pytest.warns(StaticKernelWarning, match="sha256"):
        compiler, out, inputs = _run(_config(build_dir))
    assert compiler.counters["compiled"] == 1 and compiler.counters.get("loaded", 0) == 0
    torch.testing.assert_close(out[0], _fn(*inputs)[0])
    remaining = find_packages(build_dir)
    assert len(remaining) == 1 and remaining[0] != pkg and not pkg.exists()
    (aside,) = pkg.parent.glob(pkg.name + ".refused-*")  # the evidence is kept
    assert compiler.counters["packages_refused"] == 1 and aside.stat().st_size > 0


def test_untrusted_package_is_refused_kept_and_can_be_trusted(pkg_copy, capsys):
    """Hashes rewritten together with the files prove nothing: without this user's signature nothing loads."""
    build_dir, pkg = pkg_copy
    _rewrite(pkg, sign=False)
    before = pkg.read_bytes()
    with pytest.warns(StaticKernelWarning, match=r"not trusted: .*superkernel static-compile --trust "):
        compiler, out, inputs = _run(_config(build_dir))
    assert compiler.counters["compiled"] == 1 and compiler.counters.get("loaded", 0) == 0
    assert pkg.read_bytes() == before  # refused, not touched
    for p in find_packages(build_dir):
        if p != pkg:
            p.unlink()
    assert static_cli.main(["--list", str(build_dir)]) == 0
    assert "NOT trusted" in capsys.readouterr().out
    assert static_cli.main(["--trust", str(pkg)]) == 0
    shown = capsys.readouterr().out
    assert "1 compiled partitions" in shown and "trusted now" in shown
    reset_workspaces()
    compiler, _, _ = _run(_config(build_dir))
    assert compiler.counters["loaded"] == 1 and compiler.counters.get("compiled", 0) == 0
    assert static_cli.main(["--trust", str(pkg)]) == 0 and "already trusted" in capsys.readouterr().out


class _Payload:
    """Unpickling this creates a marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_planted_payload_in_an_untrusted_package_never_runs(pkg_copy, tmp_path):
    build_dir, pkg = pkg_copy
    marker = tmp_path / "MARKER"
    _rewrite(pkg, edit_file=lambda data: pickle.dumps(_Payload(str(marker))), sign=False)  # hashes recomputed
    with pytest.warns(StaticKernelWarning, match="not trusted"):
        compiler, out, inputs = _run(_config(build_dir))
    assert not marker.exists() and compiler.counters.get("loaded", 0) == 0 and compiler.counters["compiled"] == 1
    torch.testing.assert_close(out[0], _fn(*inputs)[0])


def test_trust_key_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "skcache"))  # the key lives under the cache root
    trust.sign(b"manifest")
    key = trust.key_path()
    assert key.stat().st_mode & 0o777 == 0o600
    assert trust.verify(b"manifest", trust.sign(b"manifest")) is None
    assert "changed" in trust.verify(b"manifest2", trust.sign(b"manifest"))
    key.chmod(0o644)
    with pytest.raises(trust.TrustError, match="wider than 0600"):
        trust.sign(b"manifest")
    assert "unusable" in trust.verify(b"manifest", "00")
    key.unlink()
    other = tmp_path / "elsewhere"
    other.write_bytes(b"k" * 32)
    other.chmod(0o600)
    key.symlink_to(other)
    with pytest.raises(trust.TrustError, match="not a regular file"):
        trust.sign(b"manifest")


def test_unreadable_package_never_crashes(pkg_copy):
    build_dir, pkg = pkg_copy
    pkg.write_bytes(b"not a zip")
    with pytest.warns(StaticKernelWarning, match="damaged zip"):
        compiler, out, inputs = _run(_config(build_dir))
    assert compiler.counters["compiled"] == 1
    assert not pkg.exists() and list(pkg.parent.glob(pkg.name + ".refused-*"))


@pytest.mark.parametrize("edit, expect", [
    (lambda m: m.update(artifacts={"k": 5}), "malformed manifest: artifacts key 'k'"),
    (lambda m: m.update(environment=3), "malformed manifest: environment"),
    (lambda m: next(iter(m["files"].values())).update(size=10 ** 12), "has no valid size"),
    (lambda m: m.update(native={"../x": {"file": "native/../x.so"}}), "malformed manifest: native key '../x'"),
])
def test_malformed_manifest_is_one_line_even_when_signed(pkg_copy, edit, expect, capsys):
    build_dir, pkg = pkg_copy
    _rewrite(pkg, edit_manifest=edit)
    with pytest.warns(StaticKernelWarning, match=expect):
        compiler, _, _ = _run(_config(build_dir))
    assert compiler.counters["compiled"] == 1
    assert static_cli.main(["--list", str(build_dir)]) == 0  # the refused one was renamed aside
    assert static_cli.main(["--trust", str(next(pkg.parent.glob(pkg.name + ".refused-*")))]) == 2
    assert expect.split(":")[0] in capsys.readouterr().err


def test_symbolic_shapes_use_the_normal_path(tmp_path):
    gm, inputs = _graph(4)
    compiler = open_compiler(_config(tmp_path))
    calls = []
    sym = make_fx(_fn, tracing_mode="symbolic")(*inputs)
    fake_inputs = [n.meta["val"] for n in sym.graph.nodes if n.op == "placeholder"]
    fn = compiler.compile(sym, fake_inputs, lambda: calls.append(1) or (lambda *a: _fn(*a)))
    assert calls == [1] and compiler.counters["dynamic"] == 1
    assert not find_packages(tmp_path)
    del fn, gm


def test_build_dir_must_exist_and_be_writable(tmp_path):
    with pytest.raises(ValueError, match="build_dir: the directory does not exist"):
        _config(tmp_path / "missing")  # validated on assignment, like the rest of CompilerConfig
    gone = tmp_path / "gone"
    gone.mkdir()
    cfg = _config(gone)
    gone.rmdir()
    with pytest.raises(BuildDirError, match="does not exist"):
        open_compiler(cfg)  # and again when the backend opens the compiler
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        import os

        if os.access(ro, os.W_OK):  # running as root: permissions are not enforced
            pytest.skip("directory permissions are not enforced for this user")
        with pytest.raises(BuildDirError, match="not writable"):
            open_compiler(_config(ro))
    finally:
        ro.chmod(0o700)


def test_cli_list_and_clean(pkg_copy, capsys):
    build_dir, pkg = pkg_copy
    import argparse

    parser = argparse.ArgumentParser(prog="superkernel")
    sub = parser.add_subparsers(dest="command")
    static_cli.register(sub)
    args = parser.parse_args(["static-compile", "--list", str(build_dir)])
    assert args.func is static_cli.run and args.func(args) == 0
    out = capsys.readouterr().out
    assert pkg.name in out and "matches this machine" in out and "1 compiled partitions" in out
    assert "trusted: signed with this user's key" in out
    _rewrite(pkg, edit_manifest=lambda m: m["environment"].update(python="2.7.0"))
    args = parser.parse_args(["static-compile", "--list", str(build_dir), "--json"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["matches_this_machine"] is False and "python differs" in rows[0]["why_not"]
    assert rows[0]["trusted"] is True
    args = parser.parse_args(["static-compile", "--clean", str(build_dir)])
    assert args.func(args) == 0
    assert not find_packages(build_dir) and "removed 1 package" in capsys.readouterr().out
    args = parser.parse_args(["static-compile", "--model", "llama-tiny", "--build-dir", str(build_dir / "nope")])
    assert args.func(args) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_rejects_bad_input_before_loading_the_model(tmp_path, monkeypatch, capsys):
    import superkernel.tools.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("scopes: [unclosed\n")
    assert static_cli.main(["--model", "llama-tiny", "--build-dir", str(tmp_path), "--config", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    for threads in ("0", "-2"):
        with pytest.raises(SystemExit) as exc:
            static_cli.main(["--model", "llama-tiny", "--build-dir", str(tmp_path), "--threads", threads])
        assert exc.value.code == 2 and "--threads must be >= 1" in capsys.readouterr().err
    assert static_cli.main(["--model", "llama-tiny", "--build-dir", str(tmp_path), "--device", "tpu"]) == 2
    assert "--device 'tpu' is not a device; allowed: auto, cpu, cuda, cuda:N" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert static_cli.main(["--model", "llama-tiny", "--build-dir", str(tmp_path), "--device", "cuda"]) == 2
        assert "no CUDA device is available" in capsys.readouterr().err


def test_reduce_overhead_records_shapes_without_lock_or_package(tmp_path):
    cfg = _config(tmp_path)
    cfg.mode = "reduce-overhead"
    compiler = open_compiler(cfg)
    gm, _ = _graph(4)
    compiler.record_graph(gm, "graph_0")
    (run_dir,) = compiler.run_dirs
    names = sorted(p.name for p in (run_dir / run_dir.name.split("_")[1]).glob("*.json"))
    assert "mm_float32_ND_4x16_16x8_0.json" in names and compiler.counters["records"] == len(names)
    assert compiler.finalize() is None and not find_packages(tmp_path)
    from superkernel.static_kernel.lock import build_lock

    lock = build_lock(tmp_path / "static_kernel_outputs")
    assert not lock.is_locked


def test_failed_package_write_leaves_nothing_and_next_run_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERKERNEL_STATIC_VERIFY", "0")
    import superkernel.static_kernel.package as package_mod

    real = package_mod.zipfile.ZipFile.writestr
    calls = []

    def failing(self, name, data, *args, **kwargs):
        calls.append(name)
        if len(calls) == 2:  # the manifest went in, then the "crash"
            raise OSError("disk full (simulated)")
        return real(self, name, data, *args, **kwargs)

    monkeypatch.setattr(package_mod.zipfile.ZipFile, "writestr", failing)
    with pytest.warns(StaticKernelWarning, match="could not write the package"):
        compiler, out, inputs = _run(_config(tmp_path))
    torch.testing.assert_close(out[0], _fn(*inputs)[0])  # the run itself goes on
    assert not find_packages(tmp_path)
    assert not [p for p in (tmp_path / "static_kernel_outputs").rglob("*") if p.name.endswith(".tmp")]
    monkeypatch.setattr(package_mod.zipfile.ZipFile, "writestr", real)
    reset_workspaces()
    compiler, _, _ = _run(_config(tmp_path))  # the lock was released: the next run builds
    assert compiler.counters["compiled"] == 1 and len(find_packages(tmp_path)) == 1


def test_build_lock_is_released_when_its_holder_dies(tmp_path):
    import subprocess
    import sys

    from superkernel.static_kernel.lock import LOCK_NAME, build_lock

    root = tmp_path / "static_kernel_outputs"
    root.mkdir()
    code = (f"from filelock import FileLock; import os; l = FileLock({str(root / LOCK_NAME)!r}); l.acquire(); "
            "print('locked', flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "locked" in proc.stdout and proc.returncode != 0
    lock = build_lock(root)
    lock.acquire(timeout=5)
    lock.release()


def test_weights_read_as_attributes_are_not_baked_into_the_package(tmp_path, monkeypatch):
    """Tensors a partition reads with get_attr are lifted to inputs: a package never carries weights."""
    monkeypatch.setenv("SUPERKERNEL_STATIC_VERIFY", "0")
    x = torch.randn(3, 16)

    def traced(seed):
        torch.manual_seed(seed)
        lin = torch.nn.Linear(16, 8).eval()
        with torch.no_grad():
            gm = make_fx(lambda t: (torch.relu(lin(t)),))(x)
        assert any(n.op == "get_attr" for n in gm.graph.nodes)
        return gm, lin

    outs = []
    for seed in (0, 1):  # build with one set of weights, load with another
        reset_workspaces()
        gm, lin = traced(seed)
        compiler = open_compiler(_config(tmp_path))
        compiler.record_graph(gm, "graph_0")
        fn = compiler.compile(gm, [x], _never)
        outs.append((compiler.counters.copy(), fn(x)[0], torch.relu(lin(x)).detach()))
        compiler.finalize()
    (built, y0, ref0), (loaded, y1, ref1) = outs
    assert built["compiled"] == 1 and loaded["loaded"] == 1 and loaded.get("compiled", 0) == 0
    torch.testing.assert_close(y0, ref0)
    torch.testing.assert_close(y1, ref1)
    assert not torch.allclose(ref0, ref1)
