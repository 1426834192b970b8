"""superkernel: SuperKernel scopes, automatic fusion and static kernel compilation for PyTorch.

Public API (see README.md and docs/api.md)::

    from superkernel import super_kernel, superkernel_scope, apply_scopes, remove_scopes
    from superkernel import CompilerConfig, get_backend, compile, explain, register_unfusable
"""

from __future__ import annotations

from .config import CompilerConfig
from .explain import Explanation, explain
from .scope import parse_options, super_kernel, superkernel_scope

__version__ = "0.1.0"

_LAZY = {
    "apply_scopes": ("scope_apply", "apply_scopes"),
    "remove_scopes": ("scope_apply", "remove_scopes"),
    "get_backend": ("backend", "get_backend"),
    "compile": ("backend", "compile"),
    "SuperKernelBackend": ("backend", "SuperKernelBackend"),
    "register_unfusable": ("segments", "register_unfusable"),
    "SuperKernelScopeError": ("segments", "SuperKernelScopeError"),
    "apply": ("advisor.plan_file", "apply"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'superkernel' has no attribute {name!r}")


__all__ = [
    "CompilerConfig", "Explanation", "explain", "parse_options", "super_kernel", "superkernel_scope",
    *_LAZY,
]
