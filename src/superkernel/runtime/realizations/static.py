"""What a realization asks of the static-kernel compiler, and the compiler used when static kernels are off.

The real one is :class:`superkernel.static_kernel.compiler.StaticCompiler` (a layer above the
runtime: it implements this seam, the runtime never imports it). With static kernels off the
backend holds a :class:`NullStaticCompiler`: ``compile`` just builds, every hook does nothing,
so no stage asks whether static kernels are on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Protocol

import torch.fx as fx


class StaticCompilerSeam(Protocol):
    """The calls the backend and the realizations make on a static-kernel compiler."""

    enabled: bool

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], compile_fn: Callable[[], Callable[..., Any]], *,
                name: str | None = None) -> Callable[..., Any]: ...

    def packaged_choice(self, gm: fx.GraphModule, example_inputs: list[Any], *,
                        name: str | None = None) -> tuple[bool, str | None]: ...

    def record_freezing_choice(self, gm: fx.GraphModule, example_inputs: list[Any], choice: str,
                               timings_ms: dict[str, float]) -> None: ...

    def native_provider(self, device: str) -> Callable[[Any], Any] | None: ...

    def observe_aten_graph(self, gm: fx.GraphModule) -> None: ...

    def record_graph(self, gm: fx.GraphModule, graph_name: str, device: str | None = None) -> None: ...

    def finalize(self) -> Path | None: ...

    def wrap_function(self, fn: Any, backend: Any, compiled: Callable[..., Any]) -> Callable[..., Any]: ...

    @property
    def counters(self) -> Counter[str]: ...


class NullStaticCompiler:
    """Static kernels off: every partition is compiled the normal way, nothing is recorded or packaged."""

    enabled = False

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], compile_fn: Callable[[], Callable[..., Any]], *,
                name: str | None = None) -> Callable[..., Any]:
        return compile_fn()

    def packaged_choice(self, gm: fx.GraphModule, example_inputs: list[Any], *,
                        name: str | None = None) -> tuple[bool, str | None]:
        return False, None  # no package holds anything

    def record_freezing_choice(self, gm: fx.GraphModule, example_inputs: list[Any], choice: str,
                               timings_ms: dict[str, float]) -> None:
        pass

    def native_provider(self, device: str) -> Callable[[Any], Any] | None:
        return None  # native modules are built and cached the normal way

    def observe_aten_graph(self, gm: fx.GraphModule) -> None:
        pass

    def record_graph(self, gm: fx.GraphModule, graph_name: str, device: str | None = None) -> None:
        pass

    def finalize(self) -> Path | None:
        return None

    def wrap_function(self, fn: Any, backend: Any, compiled: Callable[..., Any]) -> Callable[..., Any]:
        return compiled

    @property
    def counters(self) -> Counter[str]:
        return Counter()
