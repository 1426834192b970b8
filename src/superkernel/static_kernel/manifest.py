"""The package manifest's schema and the limits a package is read within.

:func:`validate_manifest` checks every field the loader reads, so a malformed manifest is one
:class:`PackageError` line (``malformed manifest: artifacts['k'] is not an object``) and never
an AttributeError deep in the loader.
"""

from __future__ import annotations

import re
from typing import Any

FORMAT = "superkernel.static_kernel.package"
FORMAT_VERSION = 1

MAX_MANIFEST_BYTES = 16 << 20
MAX_MEMBER_BYTES = 1 << 30
MAX_TOTAL_BYTES = 4 << 30
MAX_MEMBERS = 20_000

_KEY = r"[0-9a-f]{16,64}"
_MEMBER_NAME = re.compile(rf"^(?:(?:artifacts|frames)/{_KEY}\.bin|native/[0-9a-f]{{32}}\.so"
                          r"|kernels/[a-z0-9]{2}/[a-z0-9]{8,128}(?:\.[a-z0-9_]{1,16})?\.(?:so|cubin|fatbin|hsaco|spv))$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NATIVE_KEY = re.compile(r"^[0-9a-f]{32}$")
_NATIVE_MODULE = re.compile(r"^sk_native_[0-9a-f]{32}$")


class PackageError(RuntimeError):
    """A package cannot be read, does not match, or is not trusted (the message says why, in one line)."""


def valid_member_name(name: str) -> bool:
    """Only the member kinds Inductor and the native CPU modules need, under their own folders: no '.', '..',
    absolute paths or others."""
    return bool(_MEMBER_NAME.fullmatch(name))  # (not match: "$" would let a final newline through)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise PackageError(f"malformed manifest: {what}")


def _str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def validate_manifest(m: Any) -> None:
    """Every field the loader reads has the right type and form (PackageError naming the first that does not)."""
    _need(_str_dict(m), "not a JSON object")
    _need(m.get("format") == FORMAT, "not a superkernel static kernel package")
    if m.get("format_version") != FORMAT_VERSION:
        raise PackageError(f"package format {str(m.get('format_version'))[:20]} (this superkernel reads {FORMAT_VERSION})")
    env = m.get("environment")
    _need(_str_dict(env) and all(v is None or isinstance(v, str) for v in env.values()),
          "environment is not an object of strings")
    _need(isinstance(m.get("config_fingerprint"), str), "config_fingerprint is not a string")
    _need(isinstance(m.get("created", ""), str), "created is not a string")
    _need(_str_dict(m.get("inductor_options", {})), "inductor_options is not an object")
    files = m.get("files")
    _need(_str_dict(files), "files is not an object")
    total = 0
    for name, meta in files.items():
        _need(valid_member_name(name), f"unexpected file name {name[:80]!r}")
        _need(_str_dict(meta) and isinstance(meta.get("sha256"), str) and bool(_SHA256.match(meta["sha256"])),
              f"files[{name!r}] has no sha256")
        size = meta.get("size")
        _need(type(size) is int and 0 <= size <= MAX_MEMBER_BYTES, f"files[{name!r}] has no valid size")
        total += size
    _need(total <= MAX_TOTAL_BYTES, f"files add up to more than {MAX_TOTAL_BYTES} bytes")
    graphs = m.get("graphs")
    _need(_str_dict(graphs), "graphs is not an object")
    for h, g in graphs.items():
        _need(_str_dict(g) and isinstance(g.get("names", []), list) and isinstance(g.get("variants", []), list)
              and all(isinstance(n, str) for n in g.get("names", [])), f"graphs[{h[:24]!r}] is malformed")
    for kind in ("artifacts", "frames"):
        table = m.get(kind)
        _need(_str_dict(table), f"{kind} is not an object")
        for key, entry in table.items():
            _need(bool(re.fullmatch(_KEY, key)), f"{kind} key {key[:80]!r} is not a hex digest")
            _need(_str_dict(entry), f"{kind}[{key[:12]}] is not an object")
            _need(entry.get("file") == f"{kind}/{key}.bin", f"{kind}[{key[:12]}] names another file")
            _need(entry["file"] in files, f"{kind}[{key[:12]}] has no file")
            if kind == "frames":
                _need(isinstance(entry.get("function"), str) and isinstance(entry.get("inputs", ""), str),
                      f"frames[{key[:12]}] has no function")
                sources = entry.get("sources", {})
                _need(_str_dict(sources) and all(isinstance(v, str) for v in sources.values()),
                      f"frames[{key[:12]}] sources are malformed")
    native = m.get("native", {})  # (absent in packages written before native modules were carried)
    _need(_str_dict(native), "native is not an object")
    for key, entry in native.items():
        _need(bool(_NATIVE_KEY.fullmatch(key)), f"native key {key[:80]!r} is not a 32-digit hex digest")
        _need(_str_dict(entry), f"native[{key[:12]}] is not an object")
        _need(entry.get("file") == f"native/{key}.so" and entry["file"] in files, f"native[{key[:12]}] has no file")
        _need(isinstance(entry.get("module"), str) and bool(_NATIVE_MODULE.fullmatch(entry["module"])),
              f"native[{key[:12]}] module name is malformed")
        abi = entry.get("abi")
        _need(_str_dict(abi) and all(isinstance(v, str) for v in abi.values()), f"native[{key[:12]}] abi is malformed")
