"""One CUDA graph per segment: capture once per input signature, replay afterwards.

* Static inputs: the tensors of the first call with a given signature are kept (a
  reference holds their memory) and used as the graph's input buffers. On replay, an
  argument that is the same storage (weights, a preallocated KV cache) is used in
  place; any other argument is copied in, and copied back out if the segment writes it.
* One memory pool per device is shared by every segment; segments replay in the order
  the step calls them, which is what sharing a pool requires.
* The first call of a signature runs the kernels eagerly (warm-up, and its result is
  the call's result), then the graph is captured; later calls replay it.
* Outputs are cloned out of the graph's static buffers, so they stay valid after
  the next call.
* Binary fusion: the graph replays exactly the kernels the segment ran eagerly, so
  results are bit-identical to the reference.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_POOLS: dict[int, Any] = {}


def shared_pool(device_index: int) -> Any:
    if device_index not in _POOLS:
        _POOLS[device_index] = torch.cuda.graph_pool_handle()
    return _POOLS[device_index]


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.storage_offset()))
        else:
            sig.append(a)
    return tuple(sig)


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, static_args: tuple[Any, ...], static_out: Any,
                 mutated: list[int]) -> None:
        self.graph = graph
        self.static_args = static_args
        self.static_out = static_out
        self.mutated = mutated

    def replay(self, args: tuple[Any, ...]) -> Any:
        copied = []
        for i, (arg, static) in enumerate(zip(args, self.static_args)):
            if isinstance(arg, torch.Tensor) and arg.data_ptr() != static.data_ptr():
                static.copy_(arg)
                copied.append(i)
        self.graph.replay()
        for i in copied:
            if i in self.mutated:
                args[i].copy_(self.static_args[i])
        return _clone_tree(self.static_out)


def _clone_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone_tree(v) for v in value)
    return value


class CudaGraphSegment:
    """Callable that runs ``fn`` as one CUDA graph per distinct input signature."""

    def __init__(self, fn: Callable[..., Any], name: str, mutated_inputs: list[int],
                 on_failure: Callable[[BaseException], None], fallback: Callable[..., Any],
                 max_captures: int = 16) -> None:
        self.fn = fn
        self.name = name
        self.mutated = list(mutated_inputs)
        self.on_failure = on_failure
        self.fallback = fallback
        self.max_captures = max_captures
        self.captures: dict[tuple[Any, ...], _Captured] = {}
        self.failed = False

    def __call__(self, *args: Any) -> Any:
        if self.failed:
            return self.fallback(*args)
        key = _signature(args)
        entry = self.captures.get(key)
        if entry is not None:
            return entry.replay(args)
        if len(self.captures) >= self.max_captures:
            return self.fn(*args)  # bounded: more shapes than we keep graphs for run uncaptured
        return self._warm_up_and_capture(args, key)

    def _warm_up_and_capture(self, args: tuple[Any, ...], key: tuple[Any, ...]) -> Any:
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        if device is None:
            return self.fn(*args)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            result = self.fn(*args)  # the warm-up is this call's real computation
        torch.cuda.current_stream(device).wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=shared_pool(device.index or 0)):
                static_out = self.fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported and degraded to eager
            self.failed = True
            self.on_failure(exc)
            return result
        self.captures[key] = _Captured(graph, args, static_out, self.mutated)
        return result
