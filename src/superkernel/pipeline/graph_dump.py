"""Write captured and segmented graphs to disk (``debug.graph_dump``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.fx as fx

from superkernel.util import atomic_write
from superkernel.ir.graph import node_scope


def _shape(val: Any) -> str:
    shape = getattr(val, "shape", None)
    if shape is None:
        return "" if val is None else type(val).__name__
    return f"{str(getattr(val, 'dtype', '')).replace('torch.', '')}{list(shape)}"


def graph_table(gm: fx.GraphModule, segmentation: Any = None) -> str:
    """One line per node: index, partition, scope, op, output shape."""
    owner = {}
    if segmentation is not None:
        for part in segmentation.partitions:
            for node in part.nodes:
                owner[node] = part.name
    lines = [f"{'idx':>5}  {'partition':<32} {'scope':<20} {'op':<40} output"]
    for i, node in enumerate(gm.graph.nodes):
        target = node.target if node.op == "call_function" else node.op
        lines.append(f"{i:>5}  {owner.get(node, '-'):<32} {node_scope(node)[0] or '-':<20} "
                     f"{str(target):<40} {_shape(node.meta.get('val'))}")
    if segmentation is not None and segmentation.cuts:
        lines.append("\ncuts:")
        lines.extend(f"  {c.describe()}" for c in segmentation.cuts)
    return "\n".join(lines) + "\n"


def dump_graph(gm: fx.GraphModule, dump_cfg: Any, name: str, segmentation: Any = None,
               modules: list[Any] | None = None) -> Path:
    """Write ``<path>/<name>.txt`` (a node table) or ``.py`` (generated code)."""
    directory = Path(dump_cfg.path or "superkernel_graphs")
    if dump_cfg.type == "py":
        text = gm.code
        for module in modules or []:
            text += f"\n\n# ---- partition {module.partition.name} ({module.partition.kind})\n{module.gm.code}"
        path = directory / f"{name}.py"
    else:
        text = graph_table(gm, segmentation) if modules is None else _segmented_table(gm, modules)
        path = directory / f"{name}.txt"
    atomic_write(path, text)
    return path


def _segmented_table(step: fx.GraphModule, modules: list[Any]) -> str:
    lines = [f"{'partition':<40} {'kind':<9} {'scope':<20} {'ops':>5}  inputs  outputs"]
    for m in modules:
        p = m.partition
        lines.append(f"{p.name:<40} {p.kind:<9} {p.scope or '-':<20} {p.num_ops:>5}  {len(m.inputs):>6}  {len(m.outputs):>7}")
    return "\n".join(lines) + "\n\n" + step.code
