"""A recording FAKE of the ``torch.cuda`` calls superkernel's CUDA graphs make — for CPU tests of our own
bookkeeping only (which inputs are copied, what is captured when, what is copied out, what happens after
a failed capture). It never stands in for a GPU result: nothing here runs on a GPU or says anything about
the driver; tests/backend/test_cuda.py (marked ``cuda``) does that on a real card.

How it imitates a graph: a capture records the callable and its (static) arguments and computes the output
buffers without leaving any effect on the arguments (a real capture executes nothing); a replay computes the
callable again on the recorded arguments and writes the results into the same output buffers (a real replay
writes the buffers allocated at capture).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch


class FakeGraph:
    def __init__(self) -> None:
        self.fn: Callable[..., Any] | None = None
        self.args: list[Any] = []
        self.out: Any = None
        self.replays = 0


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


class FakeCudaDriver:
    """Same methods as ``superkernel.runtime.cuda.driver.CudaDriver``; records what it was asked."""

    def __init__(self, fail_capture: Callable[[Sequence[Any]], bool] | None = None) -> None:
        self.events: list[str] = []
        self.graphs: list[FakeGraph] = []
        self.pools = 0
        self.fail_capture = fail_capture
        self._listening: list[str] | None = None
        self.recovered = 0

    def new_pool(self, device: Any) -> Any:
        self.pools += 1
        return ("fake-pool", self.pools)

    def new_graph(self) -> FakeGraph:
        graph = FakeGraph()
        self.graphs.append(graph)
        return graph

    @contextlib.contextmanager
    def side_stream(self, device: Any) -> Iterator[None]:
        self.events.append("warm-up")
        yield

    @contextlib.contextmanager
    def sync_check(self, found: list[str]) -> Iterator[None]:
        self._listening = found
        try:
            yield
        finally:
            self._listening = None

    def host_sync(self, where: str = "test") -> None:
        """What a synchronizing operation does under the sync check: it is heard."""
        if self._listening is not None:
            self._listening.append(where)

    def capture(self, graph: FakeGraph, pool: Any, device: Any, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        self.events.append("capture")
        if self.fail_capture is not None and self.fail_capture(args):
            raise RuntimeError("operation not permitted when stream is capturing (fake)")
        saved = [(t, t.clone()) for t in _tensors(list(args))]
        out = fn(*args)
        for t, before in saved:  # a capture leaves no effect behind
            t.copy_(before)
        graph.fn, graph.args, graph.out = fn, list(args), out
        return out

    def replay(self, graph: FakeGraph) -> None:
        self.events.append("replay")
        graph.replays += 1
        new = graph.fn(*graph.args)
        for buffer, value in zip(_tensors(graph.out), _tensors(new)):
            buffer.copy_(value)

    def recover(self, device: Any, pool: Any) -> list[str]:
        self.recovered += 1
        self.events.append("recover")
        return []
