"""Transparent huge pages for processes that stream large weights (a decode step reads every weight once).

Two supported switches put large allocations on transparent huge pages (THP) when the kernel's
THP mode is ``always`` or ``madvise``:

- PyTorch's ``THP_MEM_ALLOC_ENABLE=1``: c10's CPU allocator aligns allocations of 2 MB and more to
  2 MB and madvises them (read once, at the first allocation: set it before torch allocates);
- glibc's tunable ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35): malloc madvises its
  large blocks (read when the process starts: only a new process sees it).

This module holds the platform checks, the environment a child (or a re-executed process) gets,
and what ``/proc/self/smaps_rollup`` says about where this process's memory sits. It imports
neither torch nor onnxruntime.
"""

from __future__ import annotations

import os

TUNABLE = "glibc.malloc.hugetlb=1"
TORCH_SWITCH = "THP_MEM_ALLOC_ENABLE"
#: set to 0 to keep the ``superkernel`` CLI and the real-width benchmarks on 4 KiB pages
OPT_OUT = "SUPERKERNEL_HUGEPAGES"
THP_ENABLED_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_supports_tunable() -> bool:
    """glibc >= 2.35 (the first with ``glibc.malloc.hugetlb``)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = (int(x) for x in version.split(".")[:2])
    except (AttributeError, ValueError, OSError, TypeError):
        return False
    return name == "glibc" and (major, minor) >= (2, 35)


def transparent_huge_pages_usable(path: str = THP_ENABLED_FILE) -> bool:
    """THP is in ``always`` or ``madvise`` mode (``never``, or no such file: not usable)."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


def tunable_set(env: dict | None = None) -> bool:
    return TUNABLE in (env if env is not None else os.environ).get("GLIBC_TUNABLES", "")


def torch_switch_set(env: dict | None = None) -> bool:
    return (env if env is not None else os.environ).get(TORCH_SWITCH, "") == "1"


def opted_out(env: dict | None = None) -> bool:
    return (env if env is not None else os.environ).get(OPT_OUT, "").strip().lower() in ("0", "off", "no", "false")


def with_tunable(env: dict) -> dict:
    """``env`` plus glibc's huge-page tunable (appended to any GLIBC_TUNABLES already there, never twice)."""
    env = dict(env)
    if not tunable_set(env):
        env["GLIBC_TUNABLES"] = ":".join(x for x in (env.get("GLIBC_TUNABLES", ""), TUNABLE) if x)
    return env


def memory(path: str = "/proc/self/smaps_rollup") -> dict[str, int] | None:
    """This process's anonymous memory and the part of it on transparent huge pages, in kB
    (``anon_kb``, ``anon_huge_kb``; None where the kernel does not say: not Linux)."""
    got: dict[str, int] = {}
    keys = {"Anonymous:": "anon_kb", "AnonHugePages:": "anon_huge_kb"}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key = line.split(":", 1)[0] + ":"
                if key in keys:
                    got[keys[key]] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return got if len(got) == 2 else None


def settings(env: dict | None = None) -> dict[str, str]:
    """The page settings a process runs with (for reports)."""
    env = env if env is not None else os.environ
    return {"THP_MEM_ALLOC_ENABLE": env.get(TORCH_SWITCH, ""), "GLIBC_TUNABLES": env.get("GLIBC_TUNABLES", ""),
            "thp_mode": _thp_mode()}


def _thp_mode() -> str:
    try:
        with open(THP_ENABLED_FILE, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unknown"


def enable_for_this_process(env: dict | None = None) -> str:
    """Put this process's large PyTorch allocations on transparent huge pages, where we own the
    process (the ``superkernel`` CLI, the real-width benchmarks): set ``THP_MEM_ALLOC_ENABLE=1``
    before torch is imported, so c10 reads it at its first allocation. Returns what happened, for
    the report: ``"on"``, ``"already on"``, ``"opted out"`` (``SUPERKERNEL_HUGEPAGES=0``),
    ``"unsupported"`` (THP ``never`` or absent) or ``"too late"`` (torch already imported)."""
    import sys

    env = os.environ if env is None else env
    if opted_out(env):
        return "opted out"
    if torch_switch_set(env):
        return "already on"
    if not transparent_huge_pages_usable():
        return "unsupported"
    if "torch" in sys.modules:
        return "too late"
    env[TORCH_SWITCH] = "1"
    return "on"


def describe(env: dict | None = None) -> str:
    """One line for a report: the switches this process runs with and how much of its anonymous
    memory sits on transparent huge pages right now."""
    env = os.environ if env is None else env
    on = [name for name, is_on in ((f"{TORCH_SWITCH}=1", torch_switch_set(env)), (TUNABLE, tunable_set(env))) if is_on]
    mem = memory()
    where = (f"{mem['anon_huge_kb'] / 1024:.0f} of {mem['anon_kb'] / 1024:.0f} MB anonymous memory on huge pages"
             if mem else "huge-page use not reported")
    return f"{', '.join(on) or '4 KiB pages (no switch)'}; THP {_thp_mode()}; {where}"


def large_regions(min_mb: int = 64, path: str = "/proc/self/smaps") -> list[dict[str, int]]:
    """Anonymous mappings of at least ``min_mb`` resident MB, each with its resident and huge-page kB:
    a large region with little on huge pages is memory an allocator of its own (a library's packed
    weights, say) handed out on 4 KiB pages."""
    out: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                head = line.split(None, 1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end perms ... [path]
                    parts = line.split()
                    current = {"rss_kb": 0, "anon_huge_kb": 0} if len(parts) < 6 or parts[5] == "[heap]" else None
                    if current is not None:
                        out.append(current)
                elif current is not None and head in ("Rss:", "AnonHugePages:"):
                    current["rss_kb" if head == "Rss:" else "anon_huge_kb"] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return []
    return [r for r in out if r["rss_kb"] >= min_mb << 10]
