"""Collectives inside a segment: recognizing them, and whether a CUDA graph can hold them.

A tensor-parallel decode step traces its all-reduces as functional collectives
(``_c10d_functional.all_reduce`` ... then ``_c10d_functional.wait_tensor``). On CPU they are
ordinary operators of a segment. On CUDA a segment is one CUDA graph, which can capture a
collective only when its process group's backend supports graph capture: NCCL (>= 2.9.6,
its communicator created before capture). Anything else (gloo on CUDA tensors, an unknown
group) cuts the scope at the collective, with the reason: :func:`collective_cut_reason`,
the rule both CUDA rows apply.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

#: Operator namespaces of torch.distributed's collectives (functional and in-place c10d ops).
NAMESPACES = ("_c10d_functional", "c10d", "c10d_functional")
#: The first NCCL that supports CUDA graph capture.
NCCL_CAPTURE = (2, 9, 6)
NOT_CAPTURABLE = "collective that a CUDA graph cannot capture"


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.name()
    return getattr(target, "__name__", str(target))


def is_collective(node: fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target.namespace in NAMESPACES


def collectives(gm: fx.GraphModule) -> list[str]:
    """Names of the collective operators in ``gm`` (in order, without repeats)."""
    return list(dict.fromkeys(op_name(n) for n in gm.graph.nodes if is_collective(n)))


def group_name(node: fx.Node) -> str | None:
    """The process group a functional collective runs on (for ``wait_tensor``: the collective it waits for)."""
    if op_name(node).endswith("wait_tensor"):
        source = node.args[0] if node.args else None
        return group_name(source) if isinstance(source, fx.Node) and is_collective(source) else None
    value = node.kwargs.get("group_name", node.args[-1] if node.args else None)
    return value if isinstance(value, str) else None


def group_backend(name: str | None) -> str:
    """The backend (``nccl``, ``gloo``, ...) of the registered process group ``name``; ``unknown`` if none."""
    if name is None:
        return "unknown"
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group

        return str(dist.get_backend(_resolve_process_group(name)))
    except Exception:  # noqa: BLE001 - no such group in this process, or no torch.distributed
        return "unknown"


def nccl_version() -> tuple[int, ...] | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a torch built without NCCL
        return None
    return tuple(version) if isinstance(version, tuple) else None


def collective_cut_reason(node: fx.Node, *, backend_of: Callable[[str | None], str] = group_backend,
                          nccl: Callable[[], tuple[int, ...] | None] = nccl_version) -> str | None:
    """None when ``node`` is not a collective or a CUDA graph captures it (NCCL >= 2.9.6); else why it cuts."""
    if not is_collective(node):
        return None
    name = op_name(node)
    group = group_name(node)
    backend = backend_of(group)
    if backend == "nccl":
        version = nccl()
        if version is not None and version >= NCCL_CAPTURE:
            return None
        found = ".".join(map(str, version)) if version else "no NCCL version"
        return (f"{NOT_CAPTURABLE}: {name} on NCCL group {group!r} needs NCCL >= "
                f"{'.'.join(map(str, NCCL_CAPTURE))} for CUDA graph capture ({found})")
    return (f"{NOT_CAPTURABLE}: {name} runs on a {backend} process group ({group!r}); only NCCL collectives "
            "are captured in a CUDA graph")


def describe_cpu_collectives(gm: fx.GraphModule, cause: BaseException) -> Any:
    """For a CPU segment whose native module could not be made: the cause, naming its collectives if it has any."""
    found = [c for c in collectives(gm) if not c.endswith("wait_tensor")]
    if not found:
        return cause
    return NativeCollectiveUnsupported(
        f"it holds the collective(s) {', '.join(found)}, which the native C++ module cannot call yet "
        f"({type(cause).__name__}: {' '.join(str(cause).split())[:200]})")


class NativeCollectiveUnsupported(Exception):
    """A CPU segment with collectives runs as its flat ATen program, not as a native module."""
