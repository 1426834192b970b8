"""One private per-user cache directory for native modules and the ONNX calibration cache."""

from __future__ import annotations

import os
import stat

import pytest

from superkernel.cache_dir import CacheDirError, private_cache_dir
from superkernel.runtime.cpu.native import NativeBuildError
from superkernel.runtime.cpu.native import build as native_build


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_private_cache_dir_is_0700_and_refuses_other_owners(tmp_path, monkeypatch):
    monkeypatch.delenv("SUPERKERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = private_cache_dir("native_cpu")
    assert path == tmp_path / "xdg" / "superkernel" / "native_cpu"
    assert _mode(path) == 0o700 and _mode(path.parent) == 0o700
    assert native_build.cache_dir() == path  # the native modules use it

    own = tmp_path / "own"
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(own))  # wins over XDG_CACHE_HOME
    assert private_cache_dir() == own
    os.chmod(own, 0o777)  # group- and world-writable, though ours: refused, never repaired and then trusted
    with pytest.raises(CacheDirError, match="writable by other users"):
        private_cache_dir("sub")
    assert _mode(own) == 0o777 and not (own / "sub").exists()
    os.chmod(own, 0o700)
    assert private_cache_dir("sub") == own / "sub"

    if os.geteuid() == 0:  # another user's directory: root can make one
        os.chown(own, 65534, 65534)
    else:  # without root: a directory that is not ours
        monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", "/")
        if os.stat("/").st_uid == os.getuid():
            pytest.skip("no directory of another user to test with")
    with pytest.raises(CacheDirError, match="belongs to another user"):
        private_cache_dir()
    with pytest.raises(NativeBuildError, match="belongs to another user"):
        native_build.cache_dir()
    if os.geteuid() == 0:
        os.chown(own, os.getuid(), os.getgid())


def test_a_module_another_process_is_building_is_waited_for_not_built_twice(tmp_path, monkeypatch):
    """Our bookkeeping, with the compiler replaced by a stand-in that counts its calls: while another builder
    holds the module's lock (as the other rank of a two-process job does), build_library waits, then finds the
    module that builder signed and compiles nothing."""
    import threading

    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "_pch_dir", lambda root: root)
    calls = []
    monkeypatch.setattr(native_build, "_compile_module", lambda src, out, pch: calls.append(out))
    src = native_build.NativeSource("// lock test\n", "lock_test", ())
    out = native_build.library_path(src)  # (in the private cache, created here)
    got = []
    with native_build._exclusive(out.parent / f".{src.module_name}.lock"):  # the other builder
        waiter = threading.Thread(target=lambda: got.append(native_build.build_library(src)))
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not calls  # waiting on the lock, not compiling
        out.write_bytes(b"built by the other builder")
        native_build.sign_library(out)
    waiter.join(timeout=30)
    assert got == [out] and not calls


def test_a_precompiled_header_this_user_did_not_sign_is_removed_and_ours_is_kept(tmp_path, monkeypatch):
    """g++ reads ``sk_native_pch.h.gch`` when it lies beside the header a module includes: one this user's key
    does not vouch for is removed (under the build lock) before anything compiles against it; a signed one stays.
    Here the header is known not to precompile (``failed``), so nothing is built either way."""
    import hashlib

    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "_run", lambda *a: (_ for _ in ()).throw(AssertionError("compiled")))
    root = private_cache_dir("native_cpu")
    key = hashlib.sha256((native_build._PCH_HEADER + native_build.build_fingerprint()).encode()).hexdigest()[:24]
    directory = root / f"pch-{key}"
    directory.mkdir(mode=0o700)
    (directory / "sk_native_pch.h").write_text(native_build._PCH_HEADER)
    (directory / "failed").write_text("the precompiled header failed to build\n")
    gch = directory / "sk_native_pch.h.gch"
    gch.write_bytes(b"planted")
    assert native_build._pch_dir(root) == directory
    assert not gch.exists() and (directory / "sk_native_pch.h").read_text() == native_build._PCH_HEADER
    gch.write_bytes(b"ours")
    native_build.sign_library(gch)
    assert native_build._pch_dir(root) == directory and gch.read_bytes() == b"ours"
