"""One callable captured as a CUDA graph once per input signature, then replayed.

What a replay costs is what this module is about (a decode step is ~1 ms of GPU work; every
extra launch from Python shows):

* **In-place inputs** — parameters and buffers (Dynamo's static inputs, a ``transformers``
  StaticCache's tensors), inputs the callable writes (a KV cache), and the static outputs of an
  earlier graph of the same step — are used at their own addresses: no copy. Their address is part
  of the signature; a new address recaptures (bounded). An input produced by an earlier graph whose
  address changes (that graph fell back) is copied from then on instead.
* **Every other tensor input** (a new token id, a position, a mask made each step) is copied into
  a private buffer the graph reads. Private: the caller's tensors are never written. Only shape,
  dtype and device are in the signature, so a view with another offset or stride replays the same
  graph.
* **Outputs** are the graph's own buffers. They are handed on without a copy: the next graph of
  the step reads them in place; what leaves the step is copied out once by the step
  (:mod:`.step_graph`), which learns here which storages the graphs own.
* **Capture** happens at the first call of a signature, after a warm-up call that is that call's
  real computation, run on a side stream with torch's sync debug mode listening: a part that
  synchronizes with the host is not captured (the capture would fail) and runs uncaptured, named
  and counted. A capture that fails anyway is cleaned up (:meth:`.CudaDriver.recover`) and the part
  runs uncaptured; the process and every other graph stay healthy.
* **Bounded**: at most ``max_captures`` signatures; a further one runs uncaptured, with one warning
  naming the input that keeps changing, and a counter.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from superkernel.ir.graph import CaptureInfo
from superkernel.util import exception_summary

Program = Callable[..., Any]


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass
class _Graph:
    graph: Any
    copied: list[tuple[int, torch.Tensor]]  # (argument position, private buffer it is copied into)
    out: Any                                # the graph's output buffers, as the callable returned them

    def replay(self, driver: Any, args: Sequence[Any]) -> Any:
        for i, buffer in self.copied:
            buffer.copy_(args[i])
        driver.replay(self.graph)
        return self.out


class GraphRunner:
    """``fn`` as CUDA graphs; see the module doc. ``on_problem(text)`` warns (or raises, for
    ``strict-scope-check=abort``) when a part cannot be captured; ``owned`` collects the storages
    of graph outputs (the step copies those out)."""

    def __init__(self, fn: Program, info: CaptureInfo, *, device: torch.device, pool: Any, driver: Any,
                 in_place: Sequence[int] = (), produced: Sequence[int] = (), owned: set[int] | None = None,
                 on_problem: Callable[[str], None] = lambda text: None, max_captures: int = 8,
                 check_syncs: bool = True) -> None:
        self.fn = fn
        self.info = info
        self.device = device
        self.pool = pool
        self.driver = driver
        self.in_place = set(in_place) | set(produced)
        self.produced = set(produced)  # in place while their producer is a graph; copied once it is not
        self.owned = owned if owned is not None else set()
        self.on_problem = on_problem
        self.max_captures = max_captures
        self.check_syncs = check_syncs
        self.graphs: dict[tuple[Any, ...], _Graph] = {}
        self._last_key: tuple[Any, ...] | None = None
        self._warned_cap = False
        self._fast: _FastCheck | None = None  # the graph the last replay used, and what it takes to reuse it
        self.__name__ = self.__qualname__ = "sk_" + "".join(c if c.isalnum() else "_" for c in info.name)  # fx codegen

    # -- the call ------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self.info.status.startswith("uncaptured"):
            self.info.uncaptured_calls += 1
            return self.fn(*args)
        fast = self._fast
        if fast is not None and fast.matches(args):
            self.info.replays += 1
            return fast.graph.replay(self.driver, args)
        key = self._key(args)
        graph = self.graphs.get(key)
        if graph is not None:
            self._fast = _FastCheck(graph, args, self.in_place)
            self.info.replays += 1
            return graph.replay(self.driver, args)
        moved = self._moved_products(args)
        if moved:  # an earlier graph of the step fell back: its outputs are new tensors every call
            self.in_place -= moved
            self.info.notes.append(f"inputs {sorted(moved)} (outputs of an earlier part that runs uncaptured) "
                                   "are copied in from now on")
            key = self._key(args)
            graph = self.graphs.get(key)
            if graph is not None:
                self.info.replays += 1
                return graph.replay(self.driver, args)
        if len(self.graphs) >= self.max_captures:
            self.info.uncaptured_calls += 1
            if not self._warned_cap:
                self._warned_cap = True
                self.on_problem(f"{self.info.name}: {self.max_captures} input signatures are captured already; "
                                f"calls with a new one run uncaptured ({self._what_changed(key)})")
            return self.fn(*args)
        return self._capture(args, key)

    def _key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        key = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), a.dtype, a.device, a.data_ptr() if i in self.in_place else None))
            elif isinstance(a, torch.SymInt):
                key.append(int(a))
            else:
                key.append(a)
        return tuple(key)

    def _moved_products(self, args: Sequence[Any]) -> set[int]:
        if self._last_key is None:
            return set()
        return {i for i in self.produced & self.in_place
                if isinstance(args[i], torch.Tensor) and self._last_key[i][3] not in (None, args[i].data_ptr())}

    def _what_changed(self, key: tuple[Any, ...]) -> str:
        last = self._last_key
        if last is None:
            return "a new input signature"
        changes = []
        for i, (old, new) in enumerate(zip(last, key)):
            if old == new:
                continue
            if isinstance(new, tuple) and isinstance(old, tuple):
                what = ("address" if old[:3] == new[:3] else f"shape/dtype {old[0]}/{old[1]} -> {new[0]}/{new[1]}")
                changes.append(f"input {i}: {what}")
            else:
                changes.append(f"input {i}: value {old!r} -> {new!r} (a value baked into the graph)")
        return "; ".join(changes[:3]) or "a new input signature"

    # -- capture ---------------------------------------------------------------------------------
    def _capture(self, args: Sequence[Any], key: tuple[Any, ...]) -> Any:
        driver, device = self.driver, self.device
        if self.graphs:
            self.info.recaptures += 1
            self.info.notes.append(f"recaptured: {self._what_changed(key)}")
        self._last_key = key
        syncs: list[str] = []
        check = driver.sync_check(syncs) if self.check_syncs else contextlib.nullcontext()
        with driver.side_stream(device), check:
            result = self.fn(*args)  # the warm-up is this call's real computation
        if syncs:
            self._uncaptured(f"it synchronizes with the host (at {syncs[0]}): a CUDA graph cannot capture that")
            return result
        copied = []
        static_args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in self.in_place:
                buffer = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                buffer.copy_(a)
                static_args[i] = buffer
                copied.append((i, buffer))
        graph = driver.new_graph()
        try:
            out = driver.capture(graph, self.pool, device, self.fn, static_args)
        except Exception as exc:  # noqa: BLE001 - reported; this part runs uncaptured, the others stay graphs
            repaired = driver.recover(device, self.pool)
            self.info.failed_captures += 1
            self._uncaptured(f"capture failed: {exception_summary(exc)}"
                             + (f" (repaired after it: {'; '.join(repaired)})" if repaired else ""))
            return result
        inputs = {storage_key(a) for i, a in enumerate(static_args) if isinstance(a, torch.Tensor) and i in self.in_place}
        self.owned.update(storage_key(t) for t in _tensors(out) if storage_key(t) not in inputs)
        self.graphs[key] = _Graph(graph, copied, out)
        self._fast = _FastCheck(self.graphs[key], args, self.in_place)
        self.info.captures += 1
        self.info.status = "captured"
        self.info.copies_per_replay = len(copied)
        self.info.copied_bytes_per_replay = sum(b.numel() * b.element_size() for _, b in copied)
        return result

    def _uncaptured(self, why: str) -> None:
        self.info.status = f"uncaptured: {why}"
        self.on_problem(f"{self.info.name} runs uncaptured: {why}")


class _FastCheck:
    """Does a call take the same graph as the last one? The signature, checked without building it: the
    addresses of the in-place inputs (most of a decode step's arguments: weights and cache), the shape and
    dtype of the copied ones, the other values. A decode step has a few hundred arguments; building and
    hashing the full signature every step would cost more host time than the check needs."""

    __slots__ = ("graph", "addresses", "metas", "values")

    def __init__(self, graph: _Graph, args: Sequence[Any], in_place: set[int]) -> None:
        self.graph = graph
        self.addresses = [(i, a.data_ptr()) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i in in_place]
        self.metas = [(i, a.shape, a.dtype, a.device) for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and i not in in_place]
        self.values = [(i, a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]

    def matches(self, args: Sequence[Any]) -> bool:
        return (all(args[i].data_ptr() == p for i, p in self.addresses)
                and all(args[i].shape == s and args[i].dtype == d and args[i].device == v for i, s, d, v in self.metas)
                and all(args[i] == v for i, v in self.values))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []
