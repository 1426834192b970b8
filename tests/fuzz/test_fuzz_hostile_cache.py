"""Hostile environment, caches and keys: directories and files other people control.

Cache directories that others can write or own are refused (and left as they were), never
repaired and then trusted; what superkernel creates is 0700; the key lives under the same
checked root and follows ``SUPERKERNEL_CACHE_DIR``; a file planted in the cache under the
name the next build would use is never loaded (native modules: its constructor would
create the marker) and planted measurements are never used. Each case also checks that
nothing outside its directory and nothing in the current directory changed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import stat
import subprocess
import sysconfig
from pathlib import Path

import pytest

from superkernel.cache_dir import CacheDirError, private_cache_dir
from superkernel.static_kernel import trust
from tests.fuzz.hostile import Case

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 65534


@pytest.fixture
def case(tmp_path, monkeypatch):
    c = Case.entered(tmp_path, monkeypatch, cache_dir=False)
    yield c
    c.check()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777, 0o770])
def test_shared_cache_dir_is_refused_and_left_alone(case, monkeypatch, mode):
    root = case.work / "shared"
    root.mkdir()
    os.chmod(root, mode)
    (root / "native_cpu").mkdir(mode=0o700)
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(root))
    with pytest.raises(CacheDirError, match="writable by other users"):
        private_cache_dir("native_cpu")
    assert _mode(root) == mode  # never repaired (what is inside may already be someone else's)


@pytest.mark.skipif(not IS_ROOT, reason="making a directory of another user needs root")
@pytest.mark.parametrize("level", ["root", "sub"])
def test_foreign_cache_dir_is_refused(case, monkeypatch, level):
    root = case.work / "cache"
    (root / "native_cpu").mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    os.chown(root if level == "root" else root / "native_cpu", OTHER_UID, OTHER_UID)
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(root))
    with pytest.raises(CacheDirError, match="another user"):
        private_cache_dir("native_cpu")


def test_every_created_cache_level_is_0700(case, monkeypatch):
    root = case.work / "a" / "b" / "c"
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(root))
    private_cache_dir("native_cpu")
    for p in (case.work / "a", case.work / "a" / "b", root, root / "native_cpu"):
        assert _mode(p) == 0o700, (p, oct(_mode(p)))


def test_trust_key_lives_under_the_checked_cache_root(case, monkeypatch):
    root = case.work / "skcache"
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(root))
    trust.sign(b"manifest")
    key = trust.key_path()
    assert root in key.parents and key.is_file() and _mode(key) == 0o600
    assert not (case.work / "xdg").exists()  # not created beside it, where the variable does not point
    os.chmod(root, 0o777)  # the root turns shared: the key inside it is no longer this user's alone
    with pytest.raises(trust.TrustError, match="writable by other users"):
        trust.sign(b"manifest")
    assert "unusable" in trust.verify(b"manifest", "0" * 64)


def test_trust_key_not_created_in_a_shared_default_dir(case, monkeypatch):
    shared = case.work / "xdg" / "superkernel"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o777)
    with pytest.raises(trust.TrustError):
        trust.sign(b"manifest")
    assert list(shared.rglob("*")) == []


def test_old_key_is_migrated_once_with_a_notice(case, capsys):
    old = case.work / "xdg" / "superkernel" / "trust.key"
    old.parent.mkdir(parents=True, mode=0o700)
    secret = os.urandom(32)
    old.write_bytes(secret)
    old.chmod(0o600)
    signed_before = hmac.new(secret, b"superkernel-static-kernel-package/1\0" + b"m", hashlib.sha256).hexdigest()
    assert trust.verify(b"m", signed_before) is None  # a package signed with the old key stays trusted
    assert "copied once" in capsys.readouterr().err
    assert trust.key_path().read_bytes() == secret and trust.key_path() != old
    old.write_bytes(os.urandom(32))  # the old file is no longer read
    assert trust.verify(b"m", signed_before) is None
    assert "copied" not in capsys.readouterr().err  # once


# --- files planted in the cache -------------------------------------------------------------------

def _payload_library(directory: Path, marker: Path, name: str) -> Path:
    """A shared library whose constructor creates ``marker`` when anything dlopens it."""
    src = directory / f"{name}.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) '
                   f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    out = directory / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the planted library")
@pytest.mark.parametrize("record", ["none", "garbage", "replayed", "foreign_owner"])
def test_planted_native_module_is_never_loaded(case, monkeypatch, record):
    from superkernel.runtime.cpu.native import NativeBuildError
    from superkernel.runtime.cpu.native import build as native_build

    monkeypatch.setenv("CXX", "false")  # the rebuild it triggers fails fast: the planted file must not load
    monkeypatch.setattr(native_build, "_loaded", {})
    src = native_build.NativeSource("// planted\n", f"hostile_{record}", ())  # module sk_native_hostile_<record>
    cache = private_cache_dir("native_cpu")
    planted = cache / f"{src.module_name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    shutil.copy(_payload_library(case.work, case.marker, "payload"), planted)
    sig = planted.with_name(planted.name + ".sig")
    if record == "garbage":
        sig.write_text("0" * 64 + "\n")
    elif record == "replayed":  # a genuine record of another file of this user
        other = cache / "other.so"
        other.write_bytes(b"not the planted file")
        native_build.sign_library(other) if hasattr(native_build, "sign_library") else None
        if (cache / "other.so.sig").exists():
            shutil.copy(cache / "other.so.sig", sig)
    elif record == "foreign_owner":
        if not IS_ROOT:
            pytest.skip("needs root to plant a file of another user")
        os.chown(planted, OTHER_UID, OTHER_UID)
    try:
        native_build.load(src)
    except (NativeBuildError, ImportError):
        pass
    assert not case.marker.exists(), "a native module planted in the cache was dlopened"


def _planted_calibration(path: Path) -> None:
    entries = {"k" * 32: {"unfused_us": 1000.0, "fused_us": 1.0, "env": "x", "time": 0}}
    path.write_text(json.dumps(entries))


@pytest.mark.parametrize("kind", ["unsigned", "foreign_signed", "signed_then_edited", "foreign_owner", "symlink"])
def test_planted_calibration_entries_are_not_used(case, monkeypatch, kind):
    from superkernel.onnx import calibrate

    root = case.work / "skcache"
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(root))
    cache = private_cache_dir() / "onnx_calibration.json"
    good = {"k" * 32: {"unfused_us": 1000.0, "fused_us": 1.0, "env": "x", "time": 0}}
    if kind == "unsigned":
        _planted_calibration(cache)
    elif kind == "foreign_signed":  # a well-formed file signed with someone else's key
        other = hmac.new(os.urandom(32), b"x", hashlib.sha256).hexdigest()
        cache.write_text(json.dumps({"version": 1, "entries": good, "signature": other, **good}))
    elif kind == "signed_then_edited":
        if hasattr(calibrate, "write_cache"):
            calibrate.write_cache(str(cache), {"k" * 32: {"unfused_us": 1.0, "fused_us": 1000.0}})
            data = json.loads(cache.read_text())
            data["entries"] = good
            cache.write_text(json.dumps(data))
        else:
            _planted_calibration(cache)
    elif kind == "foreign_owner":
        if not IS_ROOT:
            pytest.skip("needs root to plant a file of another user")
        if hasattr(calibrate, "write_cache"):
            calibrate.write_cache(str(cache), good)  # signed with this user's key, but not this user's file
        else:
            _planted_calibration(cache)
        os.chown(cache, OTHER_UID, OTHER_UID)
    elif kind == "symlink":
        target = case.work / "elsewhere.json"
        _planted_calibration(target)
        cache.symlink_to(target)
    cal = calibrate.Calibrator()
    assert cal._load() == {}, f"{kind}: planted measurements were used"


def test_own_signed_calibration_entries_are_reused(case, monkeypatch):
    from superkernel.onnx import calibrate

    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(case.work / "skcache"))
    cal = calibrate.Calibrator(measure=None)
    cal._load()["k"] = {"unfused_us": 2.0, "fused_us": 1.0}
    cal.save()
    again = calibrate.Calibrator()
    assert again._load() == {"k": {"unfused_us": 2.0, "fused_us": 1.0}}
    assert trust.key_path().exists()
