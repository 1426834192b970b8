"""Put scopes around submodules without editing model source.

``apply_scopes(model, {"attn": "model.layers.*.self_attn"})`` replaces the
``forward`` of every matching submodule with a wrapper that runs the original
inside ``super_kernel(label, options)``. ``remove_scopes(model)`` restores them.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import weakref
from typing import Mapping

import torch

from superkernel.scope import parse_options, super_kernel

_ORIGINAL_ATTR = "_superkernel_original_forward"
_LABEL_ATTR = "_superkernel_scope_label"
_OPTIONS_ATTR = "_superkernel_scope_options"


class ScopeGlobError(ValueError):
    """A module glob of apply_scopes matched no submodule."""


def match_modules(model: torch.nn.Module, pattern: str) -> list[tuple[str, torch.nn.Module]]:
    """Submodules whose dotted path matches the glob (``*`` matches one path component)."""
    wanted = pattern.split(".")
    found = []
    for name, module in model.named_modules():
        if not name:
            continue
        parts = name.split(".")
        if len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted)):
            found.append((name, module))
    return found


def _close_names(model: torch.nn.Module, pattern: str, limit: int = 6) -> list[str]:
    names = [n for n, _ in model.named_modules() if n]
    # Compare with numeric indices generalised, so "layers.*.attn" finds "layers.0.self_attn".
    generic = sorted({".".join("*" if p.isdigit() else p for p in n.split(".")) for n in names})
    return difflib.get_close_matches(pattern, generic, n=limit, cutoff=0.4)


def apply_scopes(model: torch.nn.Module, scopes: Mapping[str, str | list[str]], options: str = "") -> list[str]:
    """Wrap the forward of submodules matching each glob in ``super_kernel(label, options)``.

    ``scopes`` maps a scope label to a module glob (or a list of globs), e.g.
    ``{"decode_attn": "model.layers.*.self_attn"}``. Returns the wrapped module paths.
    A glob that matches nothing raises ``ScopeGlobError`` listing close module names;
    nothing is changed in that case.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"apply_scopes needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(scopes, Mapping):
        raise TypeError(f"apply_scopes needs a mapping of scope label -> module glob(s), e.g. "
                        f"{{'attn': 'model.layers.*.self_attn'}}; got {type(scopes).__name__} {scopes!r:.80}")
    if not isinstance(options, str):
        raise TypeError(f"scope options must be a string like 'stream-fusion=1', got {options!r}")
    parse_options(options)
    plan: list[tuple[str, str, torch.nn.Module]] = []
    for label, globs in scopes.items():
        if not isinstance(label, str) or not label:
            raise ValueError(f"scope labels must be non-empty strings, got {label!r}")
        if isinstance(globs, str):
            patterns = [globs]
        elif isinstance(globs, (list, tuple)) and all(isinstance(g, str) for g in globs):
            patterns = list(globs)
        else:
            raise ValueError(f"scope {label!r} must map to a module glob or a list of globs, got {globs!r:.80}")
        if not patterns or not all(patterns):
            raise ValueError(f"scope {label!r} has no module glob (got {globs!r}); give e.g. 'model.layers.*.self_attn'")
        for pattern in patterns:
            matches = match_modules(model, pattern)
            if not matches:
                close = _close_names(model, pattern)
                hint = f"; close module paths: {', '.join(close)}" if close else ""
                raise ScopeGlobError(f"scope {label!r}: module glob {pattern!r} matches no submodule{hint}")
            plan.extend((label, name, module) for name, module in matches)
    seen: dict[str, str] = {}
    for label, name, _ in plan:
        if name in seen and seen[name] != label:
            raise ValueError(f"module {name!r} matched by scopes {seen[name]!r} and {label!r}; give each module one scope")
        seen[name] = label
    wrapped = []
    for label, name, module in plan:
        if hasattr(module, _ORIGINAL_ATTR):
            _unwrap(module)
        _wrap(module, label, options)
        wrapped.append(name)
    return wrapped


def _wrap(module: torch.nn.Module, label: str, options: str) -> None:
    original = module.forward

    @functools.wraps(original)
    def scoped_forward(*args, **kwargs):
        with super_kernel(label, options):
            return original(*args, **kwargs)

    setattr(module, _ORIGINAL_ATTR, original)
    setattr(module, _LABEL_ATTR, label)
    setattr(module, _OPTIONS_ATTR, options)
    module.forward = scoped_forward
    code = getattr(getattr(original, "__func__", original), "__code__", None)
    if code is not None:
        live = _APPLIED.setdefault(code.co_filename, {})
        live.pop(id(module), None)  # re-inserted last: the most recent scope is named first
        live[id(module)] = (label, options)
        weakref.finalize(module, _forget, code.co_filename, id(module))


def _forget(filename: str, key: int) -> None:
    _APPLIED.get(filename, {}).pop(key, None)


#: source file of a wrapped forward -> {id(module): (label, options)} of the scopes applied
#: now (entries leave on remove_scopes or when the module is freed): lets the backend name
#: the scope a Dynamo graph break happened in (its log names files and lines, not scopes).
#: Only live scopes count: a scope removed earlier in the process must not lend its options
#: (e.g. a missing strict-scope-check=abort) to a later model built from the same file.
_APPLIED: dict[str, dict[int, tuple[str, str]]] = {}


def applied_scopes_in(text: str) -> list[tuple[str, str]]:
    """``(label, options)`` of apply_scopes scopes whose module source file ``text`` mentions
    after a frame of the scope wrapper (a Dynamo graph-break record)."""
    wrapper = __file__
    if wrapper not in text and "scoped_forward" not in text:
        return []
    tail = text[text.rfind("scoped_forward"):] if "scoped_forward" in text else text
    found: list[tuple[str, str]] = []
    for filename, live in _APPLIED.items():
        if filename in tail:
            found += [scope for scope in reversed(live.values()) if scope not in found]
    return found


def _unwrap(module: torch.nn.Module) -> None:
    del module.forward  # drops the instance attribute; the class forward shows again
    original = module.__dict__.pop(_ORIGINAL_ATTR)
    code = getattr(getattr(original, "__func__", original), "__code__", None)
    if code is not None:
        _forget(code.co_filename, id(module))
    module.__dict__.pop(_LABEL_ATTR, None)
    module.__dict__.pop(_OPTIONS_ATTR, None)
    if getattr(original, "__self__", None) is not module:  # it was itself an instance override
        module.forward = original


def remove_scopes(model: torch.nn.Module) -> list[str]:
    """Undo apply_scopes on every submodule of ``model``; returns the restored module paths."""
    restored = []
    for name, module in model.named_modules():
        if _ORIGINAL_ATTR in module.__dict__:
            _unwrap(module)
            restored.append(name)
    return restored


def scoped_modules(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> scope label of every submodule wrapped by apply_scopes."""
    return {name: m.__dict__[_LABEL_ATTR] for name, m in model.named_modules() if _LABEL_ATTR in m.__dict__}


def applied_scope(module: torch.nn.Module) -> tuple[str, str] | None:
    """``(label, options)`` if apply_scopes wrapped this very module, else None."""
    if _LABEL_ATTR not in module.__dict__:
        return None
    return module.__dict__[_LABEL_ATTR], module.__dict__.get(_OPTIONS_ATTR, "")
