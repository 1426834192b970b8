"""Calibration as Inductor will compile it: a horizontal GEMM candidate's separate GEMMs and the
rule's rewrite of them, each compiled frozen through the same path as a max-autotune segment
(:func:`superkernel.runtime.inductor.cpu_freezing.compile_frozen`: weights as constants, Inductor's freezing
passes, its GEMM autotuning between C++ templates and ATen/MKL), then timed in alternating rounds.

Run in a child process (``python -m superkernel.runtime.inductor.autofusion.compiled_timing SPEC_JSON``, one JSON
line out): the planner runs inside a compile (AOTAutograd's fake mode, Dynamo's tracing context),
where compiling and running another graph is not safe; the child compiles with nothing around it.
The child is this package's own module, started with this interpreter.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any, Callable

import torch

#: seconds a child may take (two small compiles with GEMM autotuning on a loaded machine)
TIMEOUT_S = 600


def _graph(m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """The unfused ATen graph ``x, W_1..W_n[, b_1..b_n] -> [x @ W_i^T (+ b_i)]`` and real inputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    ws = [(torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype) for n in ns]
    bs = [torch.randn(n, generator=gen).to(dtype) for n in ns] if bias else []

    def fn(x: torch.Tensor, *params: torch.Tensor) -> list[torch.Tensor]:
        w, b = params[:len(ns)], params[len(ns):]
        if bias:
            return [torch.addmm(b[i], x, w[i].permute(1, 0)) for i in range(len(ns))]
        return [torch.mm(x, w[i].permute(1, 0)) for i in range(len(ns))]

    inputs = [x, *ws, *bs]
    return make_fx(fn, tracing_mode="fake")(*inputs), inputs


def _fuse(gm: torch.fx.GraphModule) -> None:
    from superkernel.runtime.inductor.autofusion.rules import horizontal_gemm, is_get_attr

    candidates, _ = horizontal_gemm.match(gm, is_get_attr)
    if len(candidates) != 1:
        raise RuntimeError(f"calibration graph: expected one horizontal candidate, found {len(candidates)}")
    horizontal_gemm.apply(gm, candidates[0])


def compiled_pair(m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool, *, gemm_templates: bool,
                  cpp_wrapper: bool) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(unfused, fused): each calls its compiled graph on the same real input."""
    from superkernel.runtime.inductor.cpu_freezing import compile_frozen

    gm, inputs = _graph(m, k, ns, dtype, bias)
    frozen = {i: t for i, t in enumerate(inputs) if i > 0}
    made = []
    for rewrite in (None, _fuse):
        fn = compile_frozen(gm, inputs, frozen, cpp_wrapper=cpp_wrapper, autotune=False,
                            gemm_templates=gemm_templates, rewrite=rewrite)
        made.append(lambda fn=fn: fn(*inputs))
    unfused, fused = made
    with torch.no_grad():
        for a, b in zip(unfused(), fused()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    return unfused, fused


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: compile both sides, time them alternately (CPU time of this thread with one torch thread)."""
    from superkernel.runtime.inductor.autofusion.calibrate import clock, paired

    torch.set_num_threads(int(spec["threads"]))
    dtype = getattr(torch, spec["dtype"])
    unfused, fused = compiled_pair(spec["m"], spec["k"], spec["ns"], dtype, spec["bias"],
                                   gemm_templates=spec["gemm_templates"], cpp_wrapper=spec["cpp_wrapper"])
    now, clock_name = clock()
    with torch.no_grad():
        out = paired(unfused, fused, now, spec["rounds"], spec["calls"])
    return {**out, "clock": clock_name, "compiled": True}


def time_compiled(m: int, k: int, ns: list[int], dtype: torch.dtype, bias: bool, *, gemm_templates: bool = True,
                  cpp_wrapper: bool = False, rounds: int = 21, calls: int = 20) -> dict[str, Any]:
    """In the parent: run :func:`measure` in a child process; its result dict (as ``calibrate.time_horizontal``)."""
    from superkernel.util import child_env

    spec = {"m": m, "k": k, "ns": list(ns), "dtype": str(dtype).replace("torch.", ""), "bias": bias,
            "threads": torch.get_num_threads(), "gemm_templates": gemm_templates, "cpp_wrapper": cpp_wrapper,
            "rounds": rounds, "calls": calls}
    done = subprocess.run([sys.executable, "-m", "superkernel.runtime.inductor.autofusion.compiled_timing", json.dumps(spec)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=child_env())
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"compiled calibration failed (exit {done.returncode}): {tail}")
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m superkernel.runtime.inductor.autofusion.compiled_timing SPEC_JSON", file=sys.stderr)
        return 2
    print(json.dumps(measure(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
