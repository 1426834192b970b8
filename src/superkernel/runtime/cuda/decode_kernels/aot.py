"""Ahead-of-time compilation of the kernel set for a GPU that is not here: each launcher is run once with its
tensors on PyTorch's ``meta`` device while Triton's launch is replaced by a recorder, and every recorded launch
is compiled by ``triton.compile`` for the target (sm_90a: ``GPUTarget("cuda", 90, 32)``), with the argument types
and the 16-divisibility Triton's own launch would specialize on. ``ptxas -v`` (shipped with Triton) then reports
registers and spills of the very PTX Triton produced.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32", torch.float64: "fp64", torch.int8: "i8"}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl")


@dataclass
class Launch:
    """One kernel launch as a launcher made it: the JIT function, its positional and keyword arguments."""
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.fn.__name__


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Launches of Triton JIT functions inside the block are recorded, not run."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):  # noqa: ARG001 (grid: not needed to compile)
        launches.append(Launch(self, args, kwargs))

    JITFunction.run = run
    try:
        yield launches
    finally:
        JITFunction.run = original


def record(launcher: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Launch]:
    """The launches ``launcher(*args, **kwargs)`` makes (arguments on the ``meta`` device)."""
    with recording() as launches:
        launcher(*args, **kwargs)
    return launches


def source(launch: Launch) -> tuple[Any, dict[str, Any]]:
    """(``ASTSource``, compile options) of a recorded launch."""
    from triton.compiler import ASTSource

    fn = launch.fn
    options = {k: v for k, v in launch.kwargs.items() if k in _OPTIONS}
    values = dict(zip(fn.arg_names, launch.args))
    values.update({k: v for k, v in launch.kwargs.items() if k not in _OPTIONS})
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, param in enumerate(fn.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # PyTorch's allocations are 16-byte aligned
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif value == 1:  # Triton's launch makes a 1 a constant
                signature[param.name] = "constexpr"
                constexprs[param.name] = 1
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {param.name} of type {type(value).__name__}")
    return ASTSource(fn, signature, constexprs=constexprs, attrs=attrs), options


_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass
class Compiled:
    kernel: str
    constexprs: dict[str, Any]
    options: dict[str, Any]
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    ptxas_log: str = field(repr=False, default="")


def ptxas_usage(ptx: str, capability: int = 90) -> dict[str, Any]:
    """Registers, spills, stack and static shared memory of ``ptx`` by ``ptxas -v`` for ``sm_<capability>``
    (``a``: the architecture-specific features Triton uses on Hopper)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(capability).path
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", src, "-o", f"{tmp}/k.cubin"], check=True,
                             capture_output=True, text=True).stderr
    used, spill, stack, smem = _USED.search(log), _SPILL.search(log), _STACK.search(log), _SMEM.search(log)
    if used is None or spill is None:
        raise RuntimeError(f"unexpected ptxas output:\n{log}")
    return {"registers": int(used.group(1)), "spill_stores": int(spill.group(1)), "spill_loads": int(spill.group(2)),
            "stack_bytes": int(stack.group(1)) if stack else 0, "shared_bytes": int(smem.group(1)) if smem else 0,
            "log": log}


def compile_launch(launch: Launch, capability: int = 90) -> Compiled:
    """Compile a recorded launch for ``sm_<capability>`` (90: sm_90a, Hopper) and read its resource usage.
    The shared memory is Triton's (its metadata); ptxas reports only static shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget

    src, options = source(launch)
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
    usage = ptxas_usage(compiled.asm["ptx"], capability)
    constexprs = {k: v for k, v in src.constants.items()}
    named = {launch.fn.arg_names[k[0]]: v for k, v in constexprs.items()}
    return Compiled(launch.name, named, {"num_warps": compiled.metadata.num_warps,
                                         "num_stages": compiled.metadata.num_stages},
                    usage["registers"], usage["spill_stores"], usage["spill_loads"], usage["stack_bytes"],
                    int(compiled.metadata.shared), usage["log"])
