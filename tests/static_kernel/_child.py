"""Child process of the static kernel tests: compile a tiny scoped model with static kernels.

    python _child.py BUILD_DIR BATCH OUT.pt [--no-static] [--function] [--graph-break] [--then-batch N]
                     [--reduce-overhead] [--quantize SCHEME]

Prints one line ``RESULT {json}`` with the backend's and the static kernel compiler's counters, the
number of C++ compilations TorchInductor started and the number of frames Dynamo traced
in this process. ``--function`` compiles a function closing over the model (which gets a
precompiled frame) instead of the model; ``--graph-break`` puts a graph break in it;
``--then-batch N`` also calls it with a batch of N after the two calls with BATCH.
``--reduce-overhead`` compiles in that mode (CPU: native modules) and also saves the exactness
reference's output (``debug.run_eagerly``) as ``ref``; the result then names every segment's
realization and whether this process has a C++ compiler. ``--quantize SCHEME`` quantizes the model first
(torchao, ``superkernel.tools.quantize``).
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.nn as nn

import superkernel
from superkernel import CompilerConfig, super_kernel

COMPILE_STACK = ("torch._functorch.aot_autograd", "torch._dynamo.repro.after_dynamo", "torch._inductor.compile_fx")
builds: list[str] = []
traced: list[str] = []


def _count_dynamo_traces() -> None:
    """Count frames Dynamo's tracer runs on (torch.compile and AOT precompile alike)."""
    from torch._dynamo import symbolic_convert

    original = symbolic_convert.InstructionTranslator.run

    def run(self, *args, **kwargs):
        traced.append(self.f_code.co_name)
        return original(self, *args, **kwargs)

    symbolic_convert.InstructionTranslator.run = run

    import superkernel.pipeline.backend as backend_module

    original_capture = backend_module.capture

    def capture(*args, **kwargs):
        traced.append("aot")
        return original_capture(*args, **kwargs)

    backend_module.capture = capture


def _count_cpp_builds() -> None:
    from torch._inductor import cpp_builder

    original = cpp_builder.CppBuilder.build

    def build(self, *args, **kwargs):
        builds.append(str(self.get_target_file_path()))
        return original(self, *args, **kwargs)

    cpp_builder.CppBuilder.build = build


class Tiny(nn.Module):
    """Two identical linears (deduplicated records), a scope, and work outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with super_kernel("blk"):
            y = torch.relu(self.a(x))
            y = torch.relu(self.b(y))
            y = self.norm(y + x)
        return y * 2.0


def main() -> int:
    build_dir, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    static = "--no-static" not in sys.argv
    _count_cpp_builds()
    _count_dynamo_traces()
    torch.manual_seed(0)
    model = Tiny().eval()
    if "--quantize" in sys.argv:
        from superkernel.tools.quantize import quantize_model

        quantize_model(model, sys.argv[sys.argv.index("--quantize") + 1])
    cfg = CompilerConfig()
    reduce_overhead = "--reduce-overhead" in sys.argv
    if reduce_overhead:
        cfg.mode = "reduce-overhead"  # (the config test_native.py builds with: same fingerprint)
    else:
        cfg.inductor.freezing = False  # packaging is tested here; test_freezing.py tests the frozen choice
    if static:
        cfg.experimental_config.static_kernel.enable = True
        cfg.experimental_config.static_kernel.build_dir = build_dir
    target = model
    if "--function" in sys.argv:
        graph_break = "--graph-break" in sys.argv

        def step(x: torch.Tensor) -> torch.Tensor:
            y = model(x)
            if graph_break:
                torch._dynamo.graph_break()
            return y + 1.0

        target = step
    compiled = superkernel.compile(target, cfg)
    x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(1))
    saved = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            y = compiled(x)
            y2 = compiled(x)
            if "--then-batch" in sys.argv:
                other = int(sys.argv[sys.argv.index("--then-batch") + 1])
                x3 = torch.randn(other, 32, generator=torch.Generator().manual_seed(2))
                saved = {"y3": compiled(x3), "eager3": target(x3)}
            eager = target(x)
            traced_by_compiled = list(traced)  # (not the exactness reference compiled below)
            # heavy parts of torch's compile stack imported so far (a process served by a package needs none)
            stack_imported = sorted(m for m in COMPILE_STACK if m in sys.modules)
            if reduce_overhead:
                ref_cfg = CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}})
                saved["ref"] = superkernel.compile(target, ref_cfg)(x)
    backend = superkernel.pipeline.backend.find_backend(compiled)
    torch.save({"y": y, "eager": eager.detach(), "y2": y2, **saved}, out)
    static = backend.static_kernels
    result = {
        "backend": dict(backend.counters),
        "static": dict(static.counters),  # (none with static kernels off: the null compiler)
        "cpp_builds": len(builds),
        "cpp_build_targets": builds[:20],
        "dynamo_traces": sum(1 for t in traced_by_compiled if t != "aot"),
        "aot_captures": traced_by_compiled.count("aot"),
        "packages": [str(p) for p in static.packages_written] if static.enabled else [],
        "warnings": [str(w.message) for w in caught if "static kernels" in str(w.message)],
        "notices": list(static.notices) if static.enabled else [],
    }
    result["compile_stack_imported"] = stack_imported
    if hasattr(compiled, "guard_path"):  # a function with static kernels: which checks its calls ran
        result["guard_path"] = compiled.guard_path
        result["frame_counters"] = compiled.frame_counters
    if reduce_overhead:
        from superkernel.runtime.cpu.native import compiler_available

        result["realizations"] = [s.realization for g in superkernel.explain(compiled).graphs for s in g.segments]
        result["compiler_available"] = compiler_available()
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
