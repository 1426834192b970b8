"""The superkernel backend as vLLM calls it: scopes by module path on the traced graph, then superkernel's
capture -> segments -> realize, guarded so a failure leaves the graph running as traced."""

from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx

from superkernel.config import CompilerConfig
from superkernel.integrations.vllm.fallback import guarded
from superkernel.integrations.vllm.scopes import STRATEGIES, annotate
from superkernel.pipeline.aot_compile import serializable, under_aot_compile
from superkernel.pipeline.backend import SuperKernelBackend


class VllmBackend(SuperKernelBackend):
    """A superkernel backend for vLLM: ``strategy`` (see :mod:`.scopes`) in ``mode`` with scope ``options``."""

    def __init__(self, strategy: str, mode: str = "reduce-overhead", options: str = "",
                 compiler_config: CompilerConfig | None = None) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown vLLM scope strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        cfg = CompilerConfig.from_dict((compiler_config or CompilerConfig()).to_dict())
        cfg.mode = mode  # validated on assignment
        super().__init__(cfg)
        self.strategy, self.options = strategy, options
        self.plan = f"{strategy} ({mode}{', ' + options if options else ''})"
        #: labels -> nodes annotated, per graph compiled (what the scopes covered)
        self.annotated: list[dict[str, int]] = []
        #: the ATen operators of each graph superkernel segmented (name -> count)
        self.aten_ops: list[dict[str, int]] = []
        self.fallbacks = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        aot = under_aot_compile()
        self.annotated.append(annotate(gm, self.strategy, self.options))

        def fallback(graph: fx.GraphModule) -> Callable[..., Any]:
            self.fallbacks += 1
            return serializable(graph) if aot else graph

        return guarded(lambda: SuperKernelBackend.__call__(self, gm, example_inputs), gm, self.plan, fallback)

    def compile_aten(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        ops: dict[str, int] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function":
                name = getattr(node.target, "name", lambda: str(node.target))()
                ops[name] = ops.get(name, 0) + 1
        self.aten_ops.append(ops)
        return super().compile_aten(gm, example_inputs, **kwargs)


__all__ = ["VllmBackend"]
