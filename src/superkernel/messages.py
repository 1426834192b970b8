"""One-line summaries of exceptions for warnings, explain tables and manifests."""

from __future__ import annotations


def exception_summary(exc: BaseException, limit: int = 300) -> str:
    """``"TypeName: first line of the message"``, at most ``limit`` characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:limit]
