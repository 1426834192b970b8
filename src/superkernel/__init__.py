"""superkernel: SuperKernel scopes, automatic fusion and static kernel compilation for PyTorch.

Public API (see README.md and docs/api.md)::

    from superkernel import super_kernel, superkernel_scope, apply_scopes, remove_scopes
    from superkernel import CompilerConfig, get_backend, compile, explain, register_unfusable
    from superkernel import apply, apply_for_generate      # superkernel[tools]: a plan on a Hugging Face model
"""

from __future__ import annotations

__version__ = "0.1.0"

# Every public name is imported on first use: ``graph-autofusion`` (superkernel.onnx) and
# the tools' argument parsing start without importing torch.
_LAZY = {
    "CompilerConfig": ("config", "CompilerConfig"),
    "Explanation": ("ir.graph", "Explanation"),
    "ScopeOptions": ("ir.graph", "ScopeOptions"),
    "SuperKernelScopeError": ("ir.graph", "SuperKernelScopeError"),
    "parse_options": ("ir.graph", "parse_options"),
    "super_kernel": ("scope", "super_kernel"),
    "superkernel_scope": ("scope", "superkernel_scope"),
    "apply_scopes": ("scope_apply", "apply_scopes"),
    "remove_scopes": ("scope_apply", "remove_scopes"),
    "explain": ("pipeline.backend", "explain"),
    "get_backend": ("pipeline.backend", "get_backend"),
    "compile": ("pipeline.backend", "compile"),
    "SuperKernelBackend": ("pipeline.backend", "SuperKernelBackend"),
    "register_unfusable": ("pipeline.segments", "register_unfusable"),
    "unregister_unfusable": ("pipeline.segments", "unregister_unfusable"),
    "apply": ("tools.advisor.plan_file", "apply"),
    "apply_for_generate": ("tools.generate", "apply_for_generate"),
    "remove_for_generate": ("tools.generate", "remove_for_generate"),
    "precompile_step": ("precompiled", "precompile_step"),
    "PrecompiledStepError": ("precompiled", "PrecompiledStepError"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'superkernel' has no attribute {name!r}")


__all__ = list(_LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
