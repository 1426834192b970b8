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

        def compile_step() -> Callable[..., Any]:
            if self.config.mode == "max-autotune" and _symbolic(example_inputs):
                # Inductor's segments specialize vLLM's dynamic token count, and Dynamo then fails building the
                # guards after the backend returned: the engine died (ConstraintViolationError, 4096 tokens)
                raise NotImplementedError("max-autotune inside vLLM needs static shapes; vLLM traces the token count "
                                          "as a dynamic size, which Inductor's segments would specialize")
            return SuperKernelBackend.__call__(self, gm, example_inputs)

        return guarded(compile_step, gm, self.plan, fallback)

    def compile_aten(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        ops: dict[str, int] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function":
                name = getattr(node.target, "name", lambda: str(node.target))()
                ops[name] = ops.get(name, 0) + 1
        self.aten_ops.append(ops)
        return super().compile_aten(gm, example_inputs, **kwargs)


def _symbolic(example_inputs: list[Any]) -> bool:
    import torch

    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape):
            return True
    return False


__all__ = ["VllmBackend"]
