"""SuperKernel scopes: label a region of model code so the backend fuses it.

A scope is carried into the captured graph through torch.fx's custom node
annotations (``torch.fx.traceback.annotate``): every operator traced inside the
``with`` block gets ``node.meta["custom"]["superkernel"] = {"scope", "options"}``,
and those annotations survive AOTAutograd into the ATen graph. Outside
``torch.compile`` the annotation only updates a dict, so eager code is unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch.fx.traceback as _fx_traceback

#: Key under ``node.meta["custom"]`` that holds a node's scope annotation.
ANNOTATION_KEY = "superkernel"

#: Allowed option keys and their allowed values; the first value is the default.
OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "stream-fusion": ("0", "1"),
    "strict-scope-check": ("bypass", "abort"),
}


@dataclass(frozen=True)
class ScopeOptions:
    """Parsed ``key=value:key=value`` options of a scope."""

    stream_fusion: bool = False
    strict_scope_check: str = "bypass"

    @property
    def abort_on_cut(self) -> bool:
        return self.strict_scope_check == "abort"


def _allowed_text() -> str:
    return "; ".join(f"{k} in {{{', '.join(v)}}}" for k, v in OPTION_VALUES.items())


def parse_options(options: str | None) -> ScopeOptions:
    """Parse a scope options string such as ``"stream-fusion=1:strict-scope-check=abort"``.

    Raises ``ValueError`` naming the offending key and the allowed keys and values.
    """
    if options is None:
        return ScopeOptions()
    if not isinstance(options, str):
        raise TypeError(f"scope options must be a string like 'stream-fusion=1', got {type(options).__name__}")
    values = {k: v[0] for k, v in OPTION_VALUES.items()}
    for part in options.split(":"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(
                f"scope option {part!r} is missing '=': write key=value pairs joined by ':'; allowed: {_allowed_text()}"
            )
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in OPTION_VALUES:
            raise ValueError(f"unknown scope option {key!r}; allowed: {_allowed_text()}")
        if value not in OPTION_VALUES[key]:
            raise ValueError(
                f"invalid value {value!r} for scope option {key!r}; allowed values: {', '.join(OPTION_VALUES[key])}"
            )
        values[key] = value
    return ScopeOptions(
        stream_fusion=values["stream-fusion"] == "1",
        strict_scope_check=values["strict-scope-check"],
    )


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
    parse_options(options)
    _check_annotate_available()
    return _fx_traceback.annotate({ANNOTATION_KEY: {"scope": scope or "", "options": options or ""}})


def superkernel_scope(enable: bool, label: str | None, option: str = "") -> ContextManager[Any]:
    """Return ``super_kernel(label, option)`` when ``enable`` is true, else a no-op context.

    Typical use: ``superkernel_scope(cfg.enable_superkernel and not is_prefill, "decode_layers", "")``.
    """
    if enable:
        return super_kernel(label, option)
    return contextlib.nullcontext()


def node_scope(node: Any) -> tuple[str, str]:
    """Return ``(scope, options)`` of an fx node; ``("", "")`` when it carries none."""
    ann = (node.meta.get("custom") or {}).get(ANNOTATION_KEY)
    if not ann:
        return "", ""
    return ann.get("scope", "") or "", ann.get("options", "") or ""
