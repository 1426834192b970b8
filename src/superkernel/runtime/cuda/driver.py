"""The ``torch.cuda`` calls that capture and replay make, behind one object.

:class:`CudaDriver` is the real thing. Tests of our bookkeeping (which inputs are copied, when a
graph is recaptured, what is copied out, what happens after a failed capture) hand the graph
runner a recording fake instead (``tests/backend/fake_cuda.py``, labelled as such): it checks our
logic, never the driver's.

Capture differs from ``torch.cuda.graph`` in three ways, each deliberate:

* no ``gc.collect()`` / ``empty_cache()`` before each capture (a step with several graphs, or a
  recapture, would pay them every time);
* ``capture_error_mode="thread_local"``: another thread's CUDA calls (a background compile) do not
  invalidate our capture;
* a failed capture is cleaned up (:meth:`CudaDriver.recover`): torch ends a capture that raised
  without ending the allocator's routing to the graph's pool or the CUDA generators' capture state,
  and the next random op then fails with "Offset increment outside graph capture" (seen on an H200,
  torch 2.11, 2026-11-27).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

#: what torch's sync debug mode says when an operation synchronizes with the host
SYNC_WARNING = "synchronizing CUDA operation"


class CudaDriver:
    """Pools, graphs, streams and the health of the CUDA context, for :mod:`.graph_runner`."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}

    # -- memory pools ------------------------------------------------------------------------
    def new_pool(self, device: torch.device) -> Any:
        """A memory pool every graph of one owner (a backend) shares. The owner keeps it: a pool lives
        while a graph captured into it does, so a handle kept in a process-wide cache outlives its graphs
        and the next capture into it fails an internal assert of the caching allocator (seen on the H200
        run of 2026-11-27, when a test's graphs were gone and the next test captured into their pool)."""
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    @staticmethod
    def pool_id(pool: Any) -> Any:
        return pool.id if hasattr(pool, "id") and not isinstance(pool, tuple) else pool

    # -- graphs ------------------------------------------------------------------------------
    def new_graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def capture_stream(self, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(index)
        return self._streams[index]

    @contextlib.contextmanager
    def side_stream(self, device: torch.device) -> Iterator[None]:
        """Run the body on a side stream ordered after the current stream's work (warm-up: lazy
        initialisation of cuBLAS handles and workspaces happens off the stream captures use)."""
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            yield
        current.wait_stream(side)

    def capture(self, graph: Any, pool: Any, device: torch.device, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """``fn(*args)`` captured into ``graph`` (allocations from ``pool``) on the capture stream; returns
        its outputs, the graph's output buffers. Raises what the call or the end of the capture raised;
        the caller then calls :meth:`recover`."""
        torch.cuda.synchronize(device)
        stream = self.capture_stream(device)
        with torch.cuda.stream(stream):
            graph.capture_begin(self.pool_id(pool), capture_error_mode="thread_local")
            try:
                out = fn(*args)
            finally:
                graph.capture_end()
        return out

    @staticmethod
    def replay(graph: Any) -> None:
        graph.replay()

    # -- checks ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sync_check(self, found: list[str]) -> Iterator[None]:
        """Run the body with torch's sync debug mode on "warn"; append to ``found`` where each host
        synchronization happened. A part that synchronizes cannot be captured."""
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        for w in caught:
            if SYNC_WARNING in str(w.message):
                found.append(f"{w.filename}:{w.lineno}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def recover(self, device: torch.device, pool: Any) -> list[str]:
        """Leave the process healthy after a failed capture; returns what had to be repaired."""
        repaired = []
        index = device.index if device.index is not None else torch.cuda.current_device()
        end = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if end is not None:
            try:
                end(index, self.pool_id(pool))
                repaired.append("the allocator still routed allocations to the graph's pool")
            except RuntimeError:
                pass  # the capture's end had already ended it
        try:
            torch.cuda.synchronize(device)
        except RuntimeError as exc:  # noqa: PERF203 - reported: the context may be unusable
            repaired.append(f"synchronize after the failed capture raised: {exc}")
        problem = self.health_problem(device)
        if problem is not None and "Offset increment" in problem:
            for generator in torch.cuda.default_generators:
                generator.graphsafe_set_state(generator.clone_state())
            repaired.append("the CUDA random generators were left in capture mode (their states were renewed)")
        return repaired

    @staticmethod
    def health_problem(device: torch.device) -> str | None:
        """None when a random op, a matmul and a synchronize run on ``device``; else the error text."""
        try:
            a = torch.empty(8, 8, device=device).uniform_()
            (a @ a).sum().item()
            torch.cuda.synchronize(device)
        except RuntimeError as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None


_DRIVER: CudaDriver | None = None


def current_driver() -> Any:
    """The driver CUDA graphs are captured and replayed through (the real one unless :func:`use_driver`)."""
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = CudaDriver()
    return _DRIVER


@contextlib.contextmanager
def use_driver(driver: Any) -> Iterator[Any]:
    """Capture and replay through ``driver`` inside the block (tests: a recording fake of ``torch.cuda``)."""
    global _DRIVER
    previous, _DRIVER = _DRIVER, driver
    try:
        yield driver
    finally:
        _DRIVER = previous
