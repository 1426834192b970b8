"""Keying a precompiled frame: what it depends on, and when a stored one is still valid.

* :func:`frame_key` covers the function's code (not its file or line numbers), the
  compiler config, the call's signature and the *structure* of every object the function
  closes over (module classes, parameter and buffer shapes and dtypes);
* :func:`external_objects` are the objects a frame uses but must never serialize (the
  model, the KV cache): they are passed to torch as external data at save and at load;
* :func:`sources_of` / :func:`stale_sources`: the source of every module Dynamo inlined
  must be unchanged since the build.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from typing import Any

import torch

from superkernel.static_kernel.signature import value_signature

FRAME_FORMAT = "superkernel-frame-1"

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _inner(fn: Any) -> Any:
    return fn.__func__ if inspect.ismethod(fn) else fn


def external_objects(fn: Any) -> dict[str, Any]:
    """Objects the frame uses but must not serialize: ``self`` of a method, and the non-plain
    values of its closure and of the module globals its code names (a model, a cache)."""
    out: dict[str, Any] = {}
    if inspect.ismethod(fn):
        out["self"] = fn.__self__
    inner = _inner(fn)
    code = getattr(inner, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(inner, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # empty cell
            continue
        if not isinstance(value, _PLAIN):
            out[f"closure:{name}"] = value
    f_globals = getattr(inner, "__globals__", None) or {}
    for name in sorted(_global_names(code)) if code is not None else ():
        value = f_globals.get(name)
        if value is not None and not isinstance(value, _PLAIN) and not _is_code_or_type(value):
            out[f"global:{name}"] = value
    return out


def _global_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def _is_code_or_type(value: Any) -> bool:
    """Modules, classes and plain functions: torch pickles these by reference, which is right for them."""
    return inspect.ismodule(value) or inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)


def _type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _structure(obj: Any) -> Any:
    if isinstance(obj, torch.nn.Module):
        from superkernel.scope_apply import applied_scope

        return {
            "modules": [(n, _type_name(m), applied_scope(m)) for n, m in obj.named_modules()],
            "tensors": [(n, list(t.shape), str(t.dtype), t.device.type)
                        for n, t in [*obj.named_parameters(), *obj.named_buffers()]],
        }
    if isinstance(obj, torch.Tensor):
        return {"tensor": [list(obj.shape), str(obj.dtype), obj.device.type]}
    return {"type": _type_name(obj)}


def call_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's arguments (shapes, strides, dtypes, devices, which tensors require grad; plain
    values), grad mode and torch thread count (torch's frame guards check both) as JSON;
    cheap: no structure walk."""
    values = [*args, *kwargs.values()]
    requires_grad = [bool(v.requires_grad) for v in values if isinstance(v, torch.Tensor)]
    return json.dumps([value_signature(list(args)), value_signature(kwargs), torch.is_grad_enabled(),
                       torch.get_num_threads(), requires_grad])


def signature_difference(built: str, here: str) -> str:
    """What differs between two call signatures, in a few words."""
    try:
        a, b = json.loads(built), json.loads(here)
    except ValueError:
        return "another call signature"
    parts = []
    if a[:2] != b[:2] or a[4:] != b[4:]:
        parts.append("argument shapes, dtypes or values")
    if len(a) > 2 and a[2] != b[2]:
        parts.append(f"grad mode ({'on' if a[2] else 'off'} in the package, {'on' if b[2] else 'off'} here)")
    if len(a) > 3 and a[3] != b[3]:
        parts.append(f"torch threads ({a[3]} in the package, {b[3]} here)")
    return ", ".join(parts) or "the closed-over objects' structure or the code"


def function_name(fn: Any) -> str:
    inner = _inner(fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def frame_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fingerprint: str) -> str:
    """Content key of a frame: code, compiler config, call signature and closed-over structure."""
    inner = _inner(fn)
    h = hashlib.sha256()
    h.update(FRAME_FORMAT.encode())
    h.update(function_name(fn).encode())
    code = getattr(inner, "__code__", None)
    if code is not None:
        _hash_code(h, code)
    h.update(fingerprint.encode())
    h.update(call_signature(args, kwargs).encode())
    ext = external_objects(fn)
    h.update(json.dumps({k: _structure(v) for k, v in sorted(ext.items())}, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _hash_code(h: Any, code: Any) -> None:
    """What a code object does, not where it lives: no file name or line numbers (moving a
    script keeps its frames; edits elsewhere in a traced module are caught by its source hash)."""
    h.update(code.co_code)
    for name in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        h.update(repr(getattr(code, name)).encode())
    for const in code.co_consts:
        if inspect.iscode(const):
            _hash_code(h, const)
        elif isinstance(const, frozenset):  # its repr order follows string hashing, which varies per process
            h.update(repr(sorted(repr(c) for c in const)).encode())
        else:
            h.update(repr(const).encode())


def _module_source_hash(module_name: str) -> str | None:
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except (ImportError, OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()


def sources_of(aot_fn: Any) -> dict[str, str]:
    """Module name -> sha256 of its source, for every module Dynamo inlined while tracing."""
    info = aot_fn.source_info()
    out: dict[str, str] = {}
    for src in getattr(info, "inlined_sources", ()):
        out[src.module] = hashlib.sha256(src.content.encode()).hexdigest()
    return dict(sorted(out.items()))


def stale_sources(recorded: dict[str, str]) -> list[str]:
    """Modules whose source changed (or cannot be read) since the frame was built."""
    return [m for m, digest in recorded.items() if _module_source_hash(m) != digest]


def frame_args(fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments a frame of ``fn`` takes: a method's frame takes its ``self`` first."""
    return (fn.__self__, *args) if inspect.ismethod(fn) else tuple(args)


__all__ = ["FRAME_FORMAT", "call_signature", "external_objects", "frame_args", "frame_key", "function_name",
           "signature_difference", "sources_of", "stale_sources"]
