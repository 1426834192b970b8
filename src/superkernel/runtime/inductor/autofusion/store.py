"""The calibration cache: measurements keyed by (rule, shapes, dtype, CPU, torch version, threads), in one
JSON file under the checked per-user cache directory, signed with this user's key.

A file that is not this user's regular file, or whose entries do not verify, is ignored (measurements
decide which rewrites are applied). JSON only: nothing is ever unpickled. Written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from superkernel.util import exception_summary

VERSION = 1
DOMAIN = b"superkernel-torch-autofusion/1"
MAX_BYTES = 16 << 20
MAX_DEPTH = 8
FILE_NAME = "torch_autofusion.json"


def default_path() -> Path | None:
    """The cache file in the private cache directory; None when that directory cannot be used safely."""
    from superkernel.cache_dir import CacheDirError, private_cache_dir

    try:
        return private_cache_dir() / FILE_NAME
    except CacheDirError:
        return None


def _bytes(entries: dict[str, Any]) -> bytes:
    return json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()


class Store:
    """Load once, look up, record, save (a failed save only costs time; its reason is kept in ``note``)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.entries: dict[str, dict[str, Any]] | None = None
        self.note: str | None = None
        self.dirty = False

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.entries is not None:
            return self.entries
        self.entries = {}
        if self.path is None or not os.path.lexists(self.path):
            return self.entries
        from superkernel.cache_dir import owned_file
        from superkernel.userkey import signed_by_me
        from superkernel.util import InputFileError, json_depth, read_limited

        if owned_file(self.path) is None:
            self.note = "ignored: not a regular file of this user that only this user can write"
            return self.entries
        try:
            raw = read_limited(self.path, MAX_BYTES, "autofusion calibration cache")
            json_depth(raw, MAX_DEPTH)
            data = json.loads(raw)
        except (InputFileError, OSError, ValueError) as exc:
            self.note = f"ignored: {exception_summary(exc)}"
            return self.entries
        entries = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not signed_by_me(DOMAIN, _bytes(entries), data.get("signature")):
            self.note = "ignored: not signed with this user's key (written by someone else, or changed)"
            return self.entries
        self.entries = {k: v for k, v in entries.items() if isinstance(v, dict)}
        return self.entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self._load().get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._load()[key] = value
        self.dirty = True

    def save(self) -> None:
        if not self.dirty or self.path is None or self.entries is None:
            return
        from superkernel.userkey import mac
        from superkernel.util import atomic_write

        try:
            text = json.dumps({"version": VERSION, "entries": self.entries,
                               "signature": mac(DOMAIN, _bytes(self.entries))}, sort_keys=True)
            atomic_write(self.path, text)
            self.dirty = False
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written only costs time
            self.note = f"not written: {exception_summary(exc)}"
