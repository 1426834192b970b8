"""Who may supply code to this process: packages signed with this user's own secret.

A package is executable code (compiled kernels, TorchInductor artifacts and Dynamo frames,
all loaded with torch's pickle-based loaders). Its file hashes prove it is intact, not who
built it: anyone who can write the build directory can rewrite members and hashes together.
So every package this user builds is signed: HMAC-SHA256 over its manifest (which holds the
sha256 of every other member) with this user's secret (:mod:`superkernel.userkey`: kept in
``keys/trust.key`` under the checked private cache root, ``$SUPERKERNEL_CACHE_DIR`` or
``$XDG_CACHE_HOME/superkernel``). A package whose signature does not verify with this
user's key is never loaded automatically; ``superkernel static-compile --trust PACKAGE``
re-signs one that a person has decided to trust.
"""

from __future__ import annotations

import hashlib
import hmac

from superkernel.userkey import KEY_BYTES, TrustError, key_path, load_key

_DOMAIN = b"superkernel-static-kernel-package/1\0"


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


__all__ = ["KEY_BYTES", "TrustError", "key_path", "load_key", "sign", "verify"]
