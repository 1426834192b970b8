"""This user's secret key, and the records signed with it.

The key (32 random bytes) lives in ``keys/trust.key`` under the checked cache root
(:func:`superkernel.cache_dir.private_cache_dir`, so it honours ``SUPERKERNEL_CACHE_DIR``
and is refused where the cache is), created 0600 and written completely before it is
linked into place. It is refused when it is a symlink, not a regular file, not owned by
this user, or readable or writable by anyone else. A key at the old location
(``$XDG_CACHE_HOME/superkernel/trust.key``) is copied there once, with a notice (left in
place for older superkernel versions of the same user; only the new one is read).

It signs static kernel packages (:mod:`superkernel.static_kernel.trust`) and the records
of what this user put in the cache (native modules, calibration entries): HMAC-SHA256 over
a domain string and the content, so a record of one kind never verifies as another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

from superkernel.cache_dir import CacheDirError, cache_root, private_cache_dir

KEY_BYTES = 32
KEY_DIR = "keys"


class TrustError(RuntimeError):
    """The trust key cannot be used (its permissions, owner, directory or content); the message says how to fix it."""


def key_path() -> Path:
    return cache_root() / KEY_DIR / "trust.key"


def legacy_key_path() -> Path:
    """Where superkernel kept the key before it followed ``SUPERKERNEL_CACHE_DIR``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.abspath(base)) / "superkernel" / "trust.key"


def _check(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise TrustError(f"trust key {path} is not a regular file; remove it (a new one is created)")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise TrustError(f"trust key {path} is owned by uid {st.st_uid}, not this user; remove it")
    if st.st_mode & 0o077:
        raise TrustError(f"trust key {path} has permissions {stat.S_IMODE(st.st_mode):04o}, wider than 0600; "
                         f"remove it (packages signed with it must then be trusted again)")


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        _check(path, os.fstat(fd))
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise TrustError(f"trust key {path} is damaged ({len(data)} bytes); remove it")
    return data


def _install(path: Path, data: bytes) -> None:
    """Write ``data`` as a new 0600 file and link it to ``path`` (never replaces: a key another process made wins)."""
    fd, tmp = tempfile.mkstemp(prefix=".trust.key.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def _migrate(path: Path) -> bool:
    """Copy a usable key from the old location to ``path`` (once: afterwards ``path`` exists), with a notice."""
    old = legacy_key_path()
    if old == path:
        return False
    try:
        old_dir = os.stat(old.parent)
        if old_dir.st_mode & 0o022 or (hasattr(os, "geteuid") and old_dir.st_uid != os.geteuid()):
            return False  # a key in a directory others could write is not ours to carry over
        data = _read(old)
    except (OSError, TrustError):
        return False
    _install(path, data)
    print(f"superkernel: this user's trust key is now {path} (copied once from {old}, which older superkernel "
          "versions still read; packages it signed stay trusted)", file=sys.stderr)
    return True


def load_key(*, create: bool) -> bytes | None:
    """This user's secret (created when ``create`` and missing; None when missing otherwise)."""
    path = key_path()
    try:
        private_cache_dir(KEY_DIR)
    except CacheDirError as exc:
        raise TrustError(f"the trust key's directory cannot be used: {exc}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not _migrate(path):
            if not create:
                return None
            _install(path, secrets.token_bytes(KEY_BYTES))
        return _read(path)
    _check(path, st)
    return _read(path)


def mac(domain: bytes, data: bytes, *, create: bool = True) -> str | None:
    """HMAC-SHA256 of ``data`` under ``domain`` with this user's key (None: no key and not ``create``)."""
    key = load_key(create=create)
    if key is None:
        return None
    return hmac.new(key, domain + b"\0" + data, hashlib.sha256).hexdigest()


def signed_by_me(domain: bytes, data: bytes, signature: object) -> bool:
    """Whether ``signature`` is this user's record of ``data`` (False when the key is missing or unusable)."""
    if not isinstance(signature, str):
        return False
    try:
        expected = mac(domain, data, create=False)
    except (TrustError, OSError):
        return False
    return expected is not None and hmac.compare_digest(expected, signature)
