"""Who may supply code to this process: packages signed with this user's own secret.

A package is executable code (compiled kernels, TorchInductor artifacts and Dynamo frames,
all loaded with torch's pickle-based loaders). Its file hashes prove it is intact, not who
built it: anyone who can write the build directory can rewrite members and hashes together.
So every package this user builds is signed: HMAC-SHA256 over its manifest (which holds the
sha256 of every other member) with a per-user secret kept in
``$XDG_CACHE_HOME/superkernel/trust.key`` (default ``~/.cache/superkernel/trust.key``),
created with mode 0600 (written completely, then linked into place). The key is refused when it is a symlink, not owned by this user, or
readable or writable by anyone else. A package whose signature does not verify with this
user's key is never loaded automatically; ``superkernel static-compile --trust PACKAGE``
re-signs one that a person has decided to trust.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_BYTES = 32
_DOMAIN = b"superkernel-static-kernel-package/1\0"


class TrustError(RuntimeError):
    """The trust key cannot be used (its permissions, owner or content); the message says how to fix it."""


def key_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "superkernel" / "trust.key"


def _check(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise TrustError(f"trust key {path} is not a regular file; remove it (a new one is created)")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise TrustError(f"trust key {path} is owned by uid {st.st_uid}, not this user; remove it")
    if st.st_mode & 0o077:
        raise TrustError(f"trust key {path} has permissions {stat.S_IMODE(st.st_mode):04o}, wider than 0600; "
                         f"remove it (packages signed with it must then be trusted again)")


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        _check(path, os.fstat(fd))
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise TrustError(f"trust key {path} is damaged ({len(data)} bytes); remove it")
    return data


def load_key(*, create: bool) -> bytes | None:
    """This user's secret (created when ``create`` and missing; None when missing otherwise)."""
    path = key_path()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".trust.key.", dir=path.parent)  # 0600, complete before it is linked
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic, never replaces: a key another process created first wins
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        return _read(path)
    _check(path, st)
    return _read(path)


def sign(manifest: bytes) -> str:
    """The signature of a package with this manifest (creates this user's key if needed)."""
    key = load_key(create=True)
    assert key is not None
    return hmac.new(key, _DOMAIN + manifest, hashlib.sha256).hexdigest()


def verify(manifest: bytes, signature: str | None) -> str | None:
    """Why a package with this manifest and signature is not trusted here (None: it is)."""
    if not signature:
        return "it is not signed"
    try:
        key = load_key(create=False)
    except (TrustError, OSError) as exc:
        return f"this user's trust key is unusable ({exc})"
    if key is None:
        return f"this user has no trust key yet ({key_path()})"
    expected = hmac.new(key, _DOMAIN + manifest, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return "it was not built by this user on this machine, or it was changed after it was built"
    return None
