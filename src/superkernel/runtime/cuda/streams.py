"""``stream-fusion=1``: independent branches of a CUDA segment on parallel streams.

The segment is still captured as one CUDA graph. Before capture its operators are
assigned to streams (:func:`assign_streams`); the program that is captured forks side
streams from the capturing stream, makes each operator wait only for the producers of
its inputs that ran on other streams, and joins every stream back at the end. CUDA
records that as a graph with parallel branches, so replay runs independent work
(q/k/v projections, gate/up, experts) concurrently. Every operator runs the same kernel
as before, so results stay bit-identical.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx


def assign_streams(gm: fx.GraphModule, max_streams: int = 4) -> dict[fx.Node, int]:
    """Map every ``call_function`` node to a stream index (0 = the capturing stream).

    A node continues the stream of its first computed input when it is that stream's
    most recent node (a chain); otherwise it is a new branch and takes the stream that
    has been idle longest. ``getitem`` stays with its producer.
    """
    stream_of: dict[fx.Node, int] = {}
    tail: dict[int, fx.Node | None] = {s: None for s in range(max_streams)}
    last_used: dict[int, int] = {s: -1 for s in range(max_streams)}
    for order, node in enumerate(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args and node.args[0] in stream_of:
            stream_of[node] = stream_of[node.args[0]]
            continue
        producers = [n for n in node.all_input_nodes if n in stream_of]
        chosen = None
        for p in producers:
            s = stream_of[p]
            if tail[s] is p or (tail[s] is not None and tail[s].target is operator.getitem and tail[s].args[0] is p):
                chosen = s
                break
        if chosen is None:
            if not producers and all(t is None for t in tail.values()):
                chosen = 0
            else:
                chosen = min(range(max_streams), key=lambda s: (tail[s] is not None and tail[s] in producers, last_used[s]))
        stream_of[node] = chosen
        tail[chosen] = node
        last_used[chosen] = order
    return stream_of


def num_streams(assignment: dict[fx.Node, int]) -> int:
    return len(set(assignment.values())) if assignment else 1


def multi_stream_program(gm: fx.GraphModule, assignment: dict[fx.Node, int]) -> Callable[..., Any]:
    """A callable running ``gm`` with the given stream assignment (CUDA), for capture.

    It interprets the graph node by node: it only runs at warm-up and at capture time,
    the replayed CUDA graph does not go through Python.
    """
    nodes = [n for n in gm.graph.nodes]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in reversed(nodes) if n.op == "output")
    used_streams = sorted(set(assignment.values()))

    def run(*args: Any) -> Any:
        current = torch.cuda.current_stream()
        streams = {0: current}
        for s in used_streams:
            if s != 0:
                streams[s] = torch.cuda.Stream(device=current.device)
                streams[s].wait_stream(current)  # fork from the capturing stream
        env: dict[fx.Node, Any] = dict(zip(placeholders, args))
        done: dict[fx.Node, torch.cuda.Event] = {}
        for node in nodes:
            if node.op != "call_function":
                continue
            stream = streams[assignment[node]]
            for dep in node.all_input_nodes:
                if dep in done and assignment.get(dep) != assignment[node]:
                    stream.wait_event(done[dep])
            with torch.cuda.stream(stream):
                args_ = fx.node.map_arg(node.args, lambda n: env[n])
                kwargs_ = fx.node.map_arg(node.kwargs, lambda n: env[n])
                env[node] = node.target(*args_, **kwargs_)
                event = torch.cuda.Event()
                event.record(stream)
                done[node] = event
        for s, stream in streams.items():
            if s != 0:
                current.wait_stream(stream)  # join every branch back
        return fx.node.map_arg(output.args[0], lambda n: env[n])

    return run
