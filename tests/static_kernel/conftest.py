"""Static kernel test helpers: fresh child processes with empty TorchInductor caches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._env import environ

HERE = Path(__file__).resolve().parent


# Temp dir of every child of this test process (set by _children_temp_dir): see fresh_env.
CHILD_TMPDIR: Path | None = None


def fresh_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment of a child with its own, empty TorchInductor cache and this test process's children's temp dir.

    The temp dir is shared by the children of one test process (not the user's): TorchInductor keeps its
    precompiled headers there on purpose (``<tmp>/torchinductor_<user>/precompiled_headers``, "global,
    rather than ignored by fresh_cache"), so each compiling child built them again (~10 s of g++) when every
    child had its own. They are not part of any package and a loading child compiles nothing either way
    (its C++ builds are counted); the Inductor cache dir, which is, stays empty per child.
    """
    env = dict(os.environ)
    cache = tmp / f"inductor_{len(list(tmp.glob('inductor_*')))}"
    tdir = CHILD_TMPDIR or tmp / f"tmp_{len(list(tmp.glob('tmp_*')))}"
    cache.mkdir(parents=True)
    tdir.mkdir(parents=True, exist_ok=True)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    env["TMPDIR"] = str(tdir)
    env.update(extra)
    return env


def run_child(tmp: Path, build_dir: Path, batch: int, out: Path, *flags: str, background: bool = False,
              script: Path | None = None, **env_extra: str):
    cmd = [sys.executable, str(script or HERE / "_child.py"), str(build_dir), str(batch), str(out), *flags]
    env = fresh_env(tmp, **env_extra)
    if background:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return parse_child(proc.returncode, proc.stdout, proc.stderr)


def parse_child(code: int, stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["stderr"] = stderr
            return result
    raise AssertionError(f"child failed (exit {code}):\n{stdout[-2000:]}\n{stderr[-4000:]}")


def shared_run_dir(tmp_path_factory, name: str) -> Path:
    """``<name>`` of this test run, private (0700): one for all xdist workers (under their base temps' common
    parent, which is this run's), the same each time a worker sets up this package's fixtures again."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / f"static_kernel_{name}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@pytest.fixture(scope="package", autouse=True)
def _private_trust_key(tmp_path_factory):
    """Packages are signed with a per-user key under $XDG_CACHE_HOME: tests (and their children) use a private one.

    Package-scoped, not session-scoped: a session fixture stays set after this package's tests, so every
    later test in the same xdist worker ran with an empty superkernel cache (native CPU modules and their
    precompiled headers rebuilt on each reduce-overhead compile: slower, and an order dependence).
    One for the whole run (shared_run_dir): the key is created once (``userkey._install`` never replaces
    one another process made) and each native module and precompiled header is built by one worker (the
    native build's file lock), not once per worker.
    """
    with environ(XDG_CACHE_HOME=str(shared_run_dir(tmp_path_factory, "xdg_cache"))):
        yield


def seeded_cache(path: Path) -> Path:
    """A new superkernel cache dir (for ``SUPERKERNEL_CACHE_DIR``) holding only this package's trust key, its
    native precompiled header and the ISA probes its static builds kept: a child building with it compiles
    its own modules into an empty native cache, without the ~9 s of g++ for the header or the ~6 s for the
    probes (built once in the package's cache, signed by the same key)."""
    from superkernel.cache_dir import private_cache_dir
    from superkernel.runtime.cpu.native import build
    from superkernel.userkey import key_path, load_key

    load_key(create=True)
    pch = build._pch_dir(private_cache_dir("native_cpu"))  # (built here when no test has built it yet)
    (path / "keys").mkdir(parents=True, mode=0o700)
    os.chmod(path, 0o700)
    shutil.copy2(key_path(), path / "keys" / key_path().name)
    (path / "native_cpu").mkdir(mode=0o700)
    shutil.copytree(pch, path / "native_cpu" / pch.name, ignore=shutil.ignore_patterns(".*.lock"))
    probes = private_cache_dir() / "isa_probes"
    if probes.is_dir():  # (none yet when no static build of this run has written a package)
        shutil.copytree(probes, path / "isa_probes")
    return path


@pytest.fixture(scope="package", autouse=True)
def _children_temp_dir(tmp_path_factory):
    """One temp dir for the children of this run (fresh_env), not the user's /tmp: shared by the xdist workers
    and fixed, since a worker sets up this package's fixtures again each time it comes back to the package
    (``--dist loadfile`` hands out files of several packages), and each new dir meant new precompiled headers."""
    global CHILD_TMPDIR
    CHILD_TMPDIR = shared_run_dir(tmp_path_factory, "children_tmp")
    _share_inductor_headers(CHILD_TMPDIR)
    yield
    CHILD_TMPDIR = None


def _share_inductor_headers(child_tmp: Path) -> None:
    """Copy the precompiled headers TorchInductor has already built in this test process's temp dir into the
    children's (~5 s of g++ each, otherwise built again by the first compiling child). They are the same files
    a child would build (named by the hash of their source and flags), and, like the children's own, part of no
    package. Each is copied holding Inductor's own lock of its build (a header another process is still building
    is complete once the lock is free), under a temporary name and renamed, so a child never sees half a file."""
    import getpass

    from filelock import FileLock
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    here = Path(default_cache_dir()) / "precompiled_headers"
    there = child_tmp / f"torchinductor_{getpass.getuser()}" / "precompiled_headers"
    if not here.is_dir():
        return
    there.mkdir(parents=True, exist_ok=True)
    for gch in here.glob("*.h.gch"):
        header = gch.with_suffix("")
        if (there / gch.name).exists():
            continue
        with FileLock(str(here / "locks" / f"{header.stem}.lock"), timeout=600):
            if not header.is_file() or not gch.is_file():
                continue
            for src in (header, gch):
                tmp = there / f".{src.name}.{os.getpid()}.tmp"
                shutil.copy2(src, tmp)
                os.replace(tmp, there / src.name)


@pytest.fixture(scope="module", autouse=True)
def _private_inductor_cache(tmp_path_factory):
    """In-process tests install kernels into TorchInductor's cache dir: use a private one."""
    with environ(TORCHINDUCTOR_CACHE_DIR=str(tmp_path_factory.mktemp("inductor_cache"))):
        yield


@pytest.fixture(autouse=True)
def _reset_workspaces():
    from superkernel.static_kernel.workspace import reset_workspaces

    reset_workspaces()
    yield
    reset_workspaces()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A build dir holding one package built by a child process (batch 2), and that run's result."""
    tmp = tmp_path_factory.mktemp("built")
    build_dir = tmp / "build"
    build_dir.mkdir()
    result = run_child(tmp, build_dir, 2, tmp / "build_out.pt")
    return {"tmp": tmp, "build_dir": build_dir, "result": result, "out": tmp / "build_out.pt"}
