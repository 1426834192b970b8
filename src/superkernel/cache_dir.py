"""The private per-user cache directory of superkernel (one implementation for every cache).

``$SUPERKERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/superkernel``, else ``~/.cache/superkernel``.
Used by the native CPU modules (``native_cpu/``) and the ONNX calibration cache. Created
with mode 0700; refused (:class:`CacheDirError`) when it or the requested subdirectory
belongs to another user, or is writable by group or others and cannot be made private —
a cache whose files are loaded as code (native modules) or trusted as measurements must
not be writable by anyone else.
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
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "superkernel"


def _check_private(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):  # a link is followed only if it points at a directory of ours
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"cache directory {path} is not a directory; set SUPERKERNEL_CACHE_DIR")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheDirError(f"cache directory {path} belongs to another user (uid {st.st_uid}); "
                            "set SUPERKERNEL_CACHE_DIR")
    if st.st_mode & 0o022:
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
        except OSError:
            raise CacheDirError(f"cache directory {path} is writable by other users; "
                                "set SUPERKERNEL_CACHE_DIR") from None


def private_cache_dir(subdir: str | None = None) -> Path:
    """The cache root (or ``subdir`` below it), created 0700 and checked private (:class:`CacheDirError`)."""
    root = cache_root()
    path = root / subdir if subdir else root
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(exist_ok=True, mode=0o700)
    except OSError as exc:
        raise CacheDirError(f"cannot create cache directory {path}: {exc.strerror or exc}; "
                            "set SUPERKERNEL_CACHE_DIR") from None
    for p in (root, path) if subdir else (root,):
        _check_private(p)
    return path


__all__ = ["CacheDirError", "cache_root", "private_cache_dir"]
