"""Hardware and software versions, for the report (absolute times only with the hardware named)."""

from __future__ import annotations

import os
import platform
import sys

import torch

from superkernel.util import cpu_name


def hardware(device: torch.device) -> str:
    cpu = f"{cpu_name()} ({platform.machine()}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()})"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}); host CPU {cpu}"
    return f"CPU: {cpu}"


def versions() -> dict[str, str]:
    import transformers

    import superkernel
    from superkernel import hugepages

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "superkernel": superkernel.__version__, "platform": platform.platform(), "pages": hugepages.describe()}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but no CUDA device is available")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device; allowed: auto, cpu, cuda, cuda:N") from None


#: Below this many parameters a CPU decode step is launch-bound: one thread is nearly as
#: fast, and unlike several threads it is not stalled when another process takes a core.
SMALL_MODEL_PARAMS = 50_000_000


def choose_threads(requested: int | None, device: torch.device, num_params: int) -> int:
    """Apply --threads (None = auto) to torch and return the count in use."""
    if requested is None:
        if device.type == "cpu" and num_params < SMALL_MODEL_PARAMS:
            requested = 1
        else:
            return torch.get_num_threads()
    if requested < 1:
        raise ValueError(f"--threads must be >= 1, got {requested}")
    torch.set_num_threads(requested)
    return requested
