"""Hostile environment, links: an output folder (or a folder on its way) that is a link out of its target.

The rule (docs/security.md, ``superkernel.util.check_link_path``): a path the tool writes is never
itself a symbolic link, every link on its way must be this user's or root's, and the folders the
tool creates inside a build directory are never links. Each case checks that nothing outside its
directory and nothing in the current directory changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from superkernel.util import OutputError
from tests.fuzz.hostile import Case, snapshot
from tests.fuzz.test_fuzz_hostile_paths import _fusable_model, _run

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NOBODY = 65534


@pytest.fixture
def case(tmp_path, monkeypatch):
    return Case.entered(tmp_path, monkeypatch)


def _link_to_outside(case: Case, name: str, *, foreign: bool = False) -> Path:
    link = case.work / name
    link.symlink_to(case.outside / "victim_dir")
    if foreign:
        os.lchown(link, NOBODY, NOBODY)  # planted by another user
    case._before["outside"] = snapshot(case.outside)
    return link


def test_optimize_output_folder_that_is_a_link_is_refused(case):
    from superkernel.tools.advisor.workflow import OptimizeOptions, check_options

    link = _link_to_outside(case, "report_dir")
    with pytest.raises(OutputError, match="symbolic link"):
        check_options(OptimizeOptions(output=link))
    case.check("optimize --output link")


def test_static_compile_build_dir_that_is_a_link_is_refused(case, capsys):
    from superkernel.tools.cli import main

    link = _link_to_outside(case, "build")
    code = main(["static-compile", "--model", "llama-tiny", "--build-dir", str(link)])
    err = capsys.readouterr().err
    assert code == 2 and "symbolic link" in err and "Traceback" not in err and err.count("\n") == 1, err
    case.check("--build-dir link")


@pytest.mark.parametrize("inside", ["outputs_dir", "run_folder"])
def test_folders_inside_a_build_dir_are_never_links(case, inside):
    """``static_kernel_outputs`` or a run's ``*_outputs`` folder planted as a link: nothing is written through it."""
    from superkernel.static_kernel.lock import build_lock
    from superkernel.static_kernel.package import OUTPUTS_DIR
    from superkernel.static_kernel.records import ShapeRecorder

    build = case.work / "build"
    build.mkdir()
    case._before["outside"] = snapshot(case.outside)
    if inside == "outputs_dir":
        (build / OUTPUTS_DIR).symlink_to(case.outside / "victim_dir")
        with pytest.raises(OutputError, match="symbolic link"):
            build_lock(build / OUTPUTS_DIR)
    else:
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx

        run = build / OUTPUTS_DIR / "1_2_outputs"
        run.mkdir(parents=True)
        (run / "2").symlink_to(case.outside / "victim_dir")  # the process's record folder
        gm = make_fx(lambda x: torch.relu(x))(torch.randn(2))
        with pytest.raises(OutputError, match="symbolic link"):
            ShapeRecorder(run, 2).record_graph(gm, "g", "h")
    case.check(inside)


@pytest.mark.parametrize("flag", ["--output", "--report", "--calibration-cache"])
@pytest.mark.skipif(not IS_ROOT, reason="a link of another user needs root to make")
def test_outputs_beneath_another_users_link_are_refused(case, flag):
    model = case.work / "m.onnx"
    onnx.save(_fusable_model(), str(model))
    link = _link_to_outside(case, "shared_out", foreign=True)
    target = link / ("o.onnx" if flag == "--output" else "r.md" if flag == "--report" else "cal.json")
    argv = ["--input", str(model), "--output", str(target if flag == "--output" else case.work / "o.onnx"),
            "--no-verify"]
    argv += [] if flag == "--output" else [flag, str(target)]
    argv += [] if flag == "--calibration-cache" else ["--no-calibrate"]
    code, err = _run(*argv)
    assert code == 2 and "another user" in err and "Traceback" not in err, (code, err[-600:])
    case.check(f"{flag} beneath a foreign link")


@pytest.mark.skipif(not IS_ROOT, reason="a link of another user needs root to make")
def test_atomic_write_never_follows_another_users_link_on_the_way(case):
    from superkernel.util import atomic_write

    link = _link_to_outside(case, "shared")
    deeper = case.work / "mine"
    deeper.symlink_to(link)  # this user's link to another user's link: the chain is walked
    os.lchown(link, NOBODY, NOBODY)
    for target in (link / "victim.txt", link / "new" / "file.txt", deeper / "file.txt"):
        with pytest.raises(OutputError, match="another user"):
            atomic_write(target, "x")
    case.check("atomic_write through a foreign link")


def test_own_links_on_the_way_are_followed(case):
    """The user's own link to a folder of theirs (a symlinked home, a scratch disk) is not a threat."""
    from superkernel.util import atomic_write, check_link_path

    real = case.work / "real"
    real.mkdir()
    (case.work / "alias").symlink_to(real)
    assert check_link_path(case.work / "alias" / "sub" / "f.txt") == real / "sub" / "f.txt"
    atomic_write(case.work / "alias" / "sub" / "f.txt", "ok")
    assert (real / "sub" / "f.txt").read_text() == "ok"
    case.check("own link")


# --- TorchInductor's cache directory --------------------------------------------------------------

def _max_autotune():
    import superkernel

    cfg = superkernel.CompilerConfig()
    cfg.mode = "max-autotune"
    return cfg


def _compile_entry() -> None:
    import superkernel

    superkernel.compile(lambda x: x + 1, _max_autotune())


@pytest.mark.parametrize("problem", ["world_writable", "group_writable", "foreign_owner"])
def test_named_inductor_cache_dir_that_others_can_write_is_refused(case, monkeypatch, problem):
    from superkernel.cache_dir import CacheDirError

    if problem == "foreign_owner" and not IS_ROOT:
        pytest.skip("a directory of another user needs root to make")
    shared = case.work / "inductor_shared"
    shared.mkdir()
    (shared / "planted.so").write_bytes(b"\x7fELF someone else's module")
    os.chmod(shared, {"world_writable": 0o777, "group_writable": 0o770, "foreign_owner": 0o755}[problem])
    if problem == "foreign_owner":
        os.chown(shared, NOBODY, NOBODY)
    before = snapshot(shared)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    with pytest.raises(CacheDirError, match="TorchInductor") as info:
        _compile_entry()
    assert "\n" not in str(info.value)
    assert snapshot(shared) == before, "the planted directory was changed"
    case.check(problem)


def test_default_inductor_cache_dir_planted_by_another_user_is_not_used(case, monkeypatch, tmp_path):
    import tempfile

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o777)
    os.chmod(tmp, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # recorded, so the redirect below is undone afterwards
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    planted = Path(default_cache_dir())
    assert planted.parent == tmp
    planted.mkdir()
    (planted / "fxgraph").mkdir()
    os.chmod(planted, 0o777)
    before = snapshot(planted)
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        _compile_entry()
    used = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert used == Path(os.environ["SUPERKERNEL_CACHE_DIR"]) / "inductor"
    assert (used.stat().st_mode & 0o777) == 0o700
    assert snapshot(planted) == before
    case.check("default inductor cache")


def test_missing_inductor_cache_dir_is_created_private(case, monkeypatch):
    target = case.work / "fresh" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(target))
    _compile_entry()
    assert (target.stat().st_mode & 0o777) == 0o700 and (target.parent.stat().st_mode & 0o777) == 0o700
    case.check("fresh inductor cache")


@pytest.mark.parametrize("command", ["optimize", "bench", "analyze"])
def test_commands_that_measure_torch_compile_refuse_a_shared_inductor_cache(case, monkeypatch, capsys, command):
    """optimize/bench/analyze also time plain ``torch.compile`` (no superkernel backend): checked at the start."""
    from superkernel.tools.cli import main

    shared = case.work / "inductor_shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    argv = {"optimize": ["optimize", "--output", str(case.work / "out")], "bench": ["bench", "--config",
            str(case.work / "missing.yaml")], "analyze": ["analyze"]}[command]
    code = main([*argv, "--model", str(case.work / "no_such_checkpoint")])  # the cache is checked first
    err = capsys.readouterr().err
    assert code == 2 and "TorchInductor's cache directory" in err and err.count("\n") == 1, err
    assert not any(shared.iterdir())
    case.check(command)
