"""The environment a package is built for: torch, Python, platform, device kind and capability.

A package is used only where all of it matches (:func:`environment_mismatch` says why not).
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from superkernel.static_kernel.compat import triton_version

# CPU features that decide which vector ISA TorchInductor compiles for.
_ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2",
)
MATCH_KEYS = ("torch", "torch_git", "python", "system", "machine", "device_kind", "device_capability")
# The rank layout a package is built for (a tensor-parallel rank's shards, hence its kernels, depend on it).
# Packages written before these were recorded were single-process builds: a missing value reads as "1".
LAYOUT_KEYS = ("world_size", "local_world_size")


def rank_layout() -> dict[str, str]:
    """World size and local world size of this process's torch.distributed job ("1" and "1" outside one)."""
    import os

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    return {"world_size": str(world), "local_world_size": str(local)}


def cpu_capability() -> str:
    """Vector-ISA-relevant CPU features, e.g. ``x86_64:avx,avx2,avx512f,...`` (no compilation needed)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    break
    except OSError:
        return f"{platform.machine()}:{platform.processor() or 'unknown'}"
    return f"{platform.machine()}:" + ",".join(sorted(flags.intersection(_ISA_FLAGS)))


def device_capability(device_kind: str) -> str:
    if device_kind == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"sm_{major}{minor}:{torch.cuda.get_device_name(index)}"
    if device_kind == "cpu":
        return cpu_capability()
    return device_kind


def environment(device_kind: str) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "triton": triton_version(),
        "python": platform.python_version(),
        "system": platform.system(),
        "machine": platform.machine(),
        "device_kind": device_kind,
        "device_capability": device_capability(device_kind),
        **rank_layout(),
    }


def layout_only_mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether ``recorded`` differs from ``current`` in its rank layout and nothing else."""
    same_layout = dict(recorded, **{k: current.get(k) for k in LAYOUT_KEYS})
    return environment_mismatch(recorded, current) is not None and environment_mismatch(same_layout, current) is None


def environment_mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a package built in ``recorded`` cannot be used in ``current`` (None when it can)."""
    keys = list(MATCH_KEYS) + (["triton"] if current.get("device_kind") == "cuda" else [])
    for key in keys:
        if recorded.get(key) != current.get(key):
            return f"{key} differs (package: {recorded.get(key)!r}, here: {current.get(key)!r})"
    for key in LAYOUT_KEYS:
        built, here = recorded.get(key) or "1", current.get(key) or "1"
        if built != here:
            what = "world size" if key == "world_size" else "local world size (ranks per node)"
            return f"package built for {what} {built}, this job has {what} {here}"
    return None
