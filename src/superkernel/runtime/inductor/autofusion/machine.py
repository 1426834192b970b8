"""What the benefit model needs to know about this machine: the per-core cache (the capacity
limit), an id of the CPU and torch build (the calibration cache key), and two measured
constants (memory bandwidth, the cost of one extra GEMM call), measured once and cached."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import torch

from superkernel.util import cpu_id

CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
#: used when neither sysfs nor lscpu says (a common L2 per core)
DEFAULT_PER_CORE_CACHE = 512 * 1024


def _parse_size(text: str) -> int | None:
    text = text.strip().upper().replace(" ", "")
    for unit, scale in (("KIB", 1 << 10), ("MIB", 1 << 20), ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * scale)
            except ValueError:
                return None
    return int(text) if text.isdigit() else None


def per_core_cache_bytes() -> tuple[int, str]:
    """(bytes, where it was read): the largest cache level private to cpu0 (its ``shared_cpu_list`` is
    cpu0 alone: L2 on most x86 parts), from sysfs, else ``lscpu``'s L2 (total / instances), else a default."""
    best = None
    try:
        for index in sorted(CACHE_SYSFS.glob("index*")):
            kind = (index / "type").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
            size = _parse_size((index / "size").read_text())
            if kind in ("Data", "Unified") and shared in ("0", "0-0") and size:
                level = int((index / "level").read_text())
                if best is None or level > best[0]:
                    best = (level, size)
    except (OSError, ValueError):
        best = None
    if best is not None:
        return best[1], f"sysfs L{best[0]} of cpu0"
    try:
        out = subprocess.run(["lscpu", "-B"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("L2 cache:"):
                parts = line.split(":", 1)[1].split("(")
                total = _parse_size(parts[0])
                instances = int(parts[1].split()[0]) if len(parts) > 1 else 1
                if total:
                    return total // max(instances, 1), "lscpu L2 / instances"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return DEFAULT_PER_CORE_CACHE, "default (no cache size found)"


def environment() -> str:
    """The part of every calibration key that says where it was measured."""
    return f"{cpu_id()}|torch {torch.__version__}|threads {torch.get_num_threads()}|clock v5"


def measure_bandwidth(megabytes: int = 32, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Bytes/s of a copy (read + write) of a ``megabytes`` float32 tensor on ``device``: the best of
    ``repeats`` (also the decode benchmarks' memory roofline)."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = megabytes * 2**20 // 4
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n * 4 / best


def measure_call_us(repeats: int = 200) -> float:
    """Median µs of one tiny GEMM call (1x8 @ 8x8): what one more GEMM costs beyond its bytes."""
    from superkernel.runtime.inductor.autofusion.calibrate import clock

    now = clock()[0]
    a, b = torch.randn(1, 8), torch.randn(8, 8)
    samples = []
    with torch.no_grad():
        for _ in range(5):
            torch.mm(a, b)
        for _ in range(repeats // 10):
            start = now()
            for _ in range(10):
                torch.mm(a, b)
            samples.append((now() - start) / 10 * 1e6)
    return statistics.median(samples)
