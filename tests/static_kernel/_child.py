"""Child process of the static kernel tests: compile a tiny scoped model with static kernels.

    python _child.py BUILD_DIR BATCH OUT.pt [--no-static]

Prints one line ``RESULT {json}`` with the backend's and the session's counters and the
number of C++ compilations TorchInductor started in this process.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.nn as nn

import superkernel
from superkernel import CompilerConfig, super_kernel

builds: list[str] = []


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
    torch.manual_seed(0)
    model = Tiny().eval()
    cfg = CompilerConfig()
    if static:
        cfg.experimental_config.static_kernel.enable = True
        cfg.experimental_config.static_kernel.build_dir = build_dir
    compiled = superkernel.compile(model, cfg)
    x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            y = compiled(x)
            y2 = compiled(x)
    backend = superkernel.backend.find_backend(compiled)
    torch.save({"y": y, "eager": model(x).detach(), "y2": y2}, out)
    session = backend.static_kernels
    result = {
        "backend": dict(backend.counters),
        "static": dict(session.counters) if session is not None else {},
        "cpp_builds": len(builds),
        "packages": [str(p) for p in session.packages_written] if session is not None else [],
        "warnings": [str(w.message) for w in caught if "static kernels" in str(w.message)],
        "notices": list(session.notices) if session is not None else [],
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
