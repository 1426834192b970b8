"""The private per-user cache directory of superkernel (one implementation for every cache).

``$SUPERKERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/superkernel``, else ``~/.cache/superkernel``.
Used by the native CPU modules (``native_cpu/``), the ONNX calibration cache and the trust
key (``keys/``). Every directory it creates is created 0700 (the root's missing parents
too). A directory that exists is checked, never repaired: it must be a directory owned by
this user and not writable by group or others, else :class:`CacheDirError` — a cache whose
files are loaded as code (native modules) or trusted as measurements must not be writable
by anyone else, and a directory someone else could write may already hold their files.
A file inside is used only when :func:`owned_file` says this user made it; its content is
then checked against a record signed with this user's key (:mod:`superkernel.userkey`).
See docs/security.md.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class CacheDirError(OSError):
    """The cache directory cannot be used safely (the message says why and what to set)."""


def cache_root() -> Path:
    """``$SUPERKERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/superkernel``, else ``~/.cache/superkernel`` (not created)."""
    base = os.environ.get("SUPERKERNEL_CACHE_DIR")
    if base:
        return Path(os.path.abspath(Path(base).expanduser()))
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(os.path.abspath((Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "superkernel"))


def _uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def check_private(path: Path, what: str = "cache directory", env: str = "SUPERKERNEL_CACHE_DIR") -> None:
    """Refuse ``path`` unless it is a directory of this user that group and others cannot write.

    A symlink is followed only to a directory that passes the same checks (its target is
    what is used). Nothing is changed: a directory that fails is refused, not repaired.
    ``what`` and ``env`` name the directory and the variable that moves it in the message.
    """
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"{what} {path} is not a directory; set {env}")
    uid = _uid()
    if uid is not None and st.st_uid != uid:
        raise CacheDirError(f"{what} {path} belongs to another user (uid {st.st_uid}); "
                            f"set {env} to a directory of yours")
    if st.st_mode & 0o022:
        raise CacheDirError(f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                            f"its content cannot be trusted: remove it or set {env}")


def _make_dirs(path: Path) -> None:
    """``mkdir -p`` with every created level 0700 (umask cannot widen it)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(p, 0o700)


def private_cache_dir(subdir: str | None = None) -> Path:
    """The cache root (or ``subdir`` below it), created 0700 and checked private (:class:`CacheDirError`)."""
    root = cache_root()
    path = root
    for part in [None, *(Path(subdir).parts if subdir else ())]:  # each level checked before the next is made
        path = path / part if part else path
        try:
            _make_dirs(path)
        except OSError as exc:
            raise CacheDirError(f"cannot create cache directory {path}: {exc.strerror or exc}; "
                                "set SUPERKERNEL_CACHE_DIR") from None
        check_private(path)
    return path


def owned_file(path: Path | str) -> os.stat_result | None:
    """The ``lstat`` of ``path`` when it is a regular file of this user that others cannot write; else None
    (missing, a link, a FIFO or device, another user's, group- or world-writable)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    uid = _uid()
    if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid) or st.st_mode & 0o022:
        return None
    return st


INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
INDUCTOR_SUBDIR = "inductor"


def _inductor_default() -> str:
    """TorchInductor's default cache directory (``<tmp>/torchinductor_<user>``), as torch computes it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # pragma: no cover - older torch
        import getpass
        import tempfile

        return os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser())
    return default_cache_dir()


def check_inductor_cache() -> Path:
    """Make sure TorchInductor's cache directory is private before superkernel compiles; returns it.

    TorchInductor loads compiled modules (``.so``) and cached graphs from its cache directory,
    ``$TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>`` — a name in a shared
    directory that another user can create first. The directory is checked as superkernel's
    own cache is (:func:`check_private`; missing levels created 0700). One the user named
    (``TORCHINDUCTOR_CACHE_DIR``) that fails is refused (:class:`CacheDirError`). The default
    one that fails is not used: ``TORCHINDUCTOR_CACHE_DIR`` is pointed at ``inductor/`` under
    superkernel's private cache root, with a warning (so another user cannot stop compiling
    by creating the name first).
    """
    env = os.environ.get(INDUCTOR_ENV)
    default = os.path.abspath(_inductor_default())
    named = bool(env) and os.path.abspath(env) != default
    path = Path(os.path.abspath(env)) if named else Path(default)
    try:
        _make_dirs(path)
        check_private(path, "TorchInductor's cache directory", INDUCTOR_ENV)
    except OSError as exc:
        reason = exc if isinstance(exc, CacheDirError) else f"{path}: {exc.strerror or exc}"
        if named:
            raise CacheDirError(str(reason)) from None
        private = private_cache_dir(INDUCTOR_SUBDIR)
        os.environ[INDUCTOR_ENV] = str(private)
        import warnings

        warnings.warn(f"{reason}; superkernel uses {private} instead", RuntimeWarning, stacklevel=2)
        return private
    os.environ[INDUCTOR_ENV] = str(path)  # pinned, as TorchInductor itself does on first use
    return path


__all__ = ["CacheDirError", "INDUCTOR_ENV", "cache_root", "check_inductor_cache", "check_private", "owned_file",
           "private_cache_dir"]
