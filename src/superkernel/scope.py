"""SuperKernel scopes: label a region of model code so the backend fuses it.

A scope is carried into the captured graph through torch.fx's custom node
annotations (``torch.fx.traceback.annotate``): every operator traced inside the
``with`` block gets ``node.meta["custom"]["superkernel"] = {"scope", "options"}``,
and those annotations survive AOTAutograd into the ATen graph. Outside
``torch.compile`` the annotation only updates a dict, so eager code is unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch.fx.traceback as _fx_traceback

from superkernel.ir.graph import ANNOTATION_KEY, OPTION_VALUES, ScopeOptions, node_scope, option_values, parse_options

__all__ = ["super_kernel", "superkernel_scope", "parse_options", "node_scope", "ScopeOptions", "OPTION_VALUES",
           "ANNOTATION_KEY"]

def _check_annotate_available() -> None:
    if not hasattr(_fx_traceback, "annotate"):  # pragma: no cover - torch < 2.9
        raise RuntimeError(
            "superkernel scopes need torch.fx.traceback.annotate (torch>=2.11); "
            f"this torch has no such API"
        )


def super_kernel(scope: str | None, options: str = "") -> ContextManager[None]:
    """Mark the operators traced inside the ``with`` block as one SuperKernel scope.

    ``scope=None`` or ``""`` inside another scope marks a region that must not be fused.
    The innermost scope wins. Options are validated immediately (``ValueError``).
    """
    if scope is not None and not isinstance(scope, str):
        raise TypeError(f"scope label must be a string or None, got {type(scope).__name__}")
    if options is not None and not isinstance(options, str):
        raise TypeError(f"scope options must be a string like 'stream-fusion=1', got {type(options).__name__}")
    option_values(options or "")  # validated now; parsed (once per string) when the graph is segmented
    _check_annotate_available()
    return _fx_traceback.annotate({ANNOTATION_KEY: {"scope": scope or "", "options": options or ""}})


def superkernel_scope(enable: bool, label: str | None, option: str = "") -> ContextManager[Any]:
    """Return ``super_kernel(label, option)`` when ``enable`` is true, else a no-op context.

    Typical use: ``superkernel_scope(cfg.enable_superkernel and not is_prefill, "decode_layers", "")``.
    """
    if enable:
        return super_kernel(label, option)
    return contextlib.nullcontext()
