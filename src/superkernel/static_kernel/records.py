"""Shape records: every operator a compiled graph executes, with its input signature.

Layout (after TorchAir's static kernel outputs)::

    <build_dir>/static_kernel_outputs/
        <timestamp>_<pid>_outputs/
            <pid>/                       one JSON per distinct (operator, signature)
                mm_float32_ND_2x64_64x128_0.json
            <pid>_debug/                 the same names, full records: every occurrence
                mm_float32_ND_2x64_64x128_0.json
            static_kernel_<datetime>.skpkg

File names are ``<Op>_<dtype>_<layout>_<shape>_<n>.json``: dtype and layout of the
first tensor input, the shapes of all tensor inputs (dims joined by ``x``, inputs by
``_``), and ``n`` numbering distinct signatures that would otherwise share a name
(they differ in strides, device, scalar arguments or later inputs' dtypes).
Records are deduplicated by content: a signature seen again adds an occurrence to
the debug record and never a new file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch.fx as fx

from superkernel.static_kernel.signature import is_operator_node, target_name, value_signature
from superkernel.util import atomic_write, make_dirs

MAX_STEM = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _tensor_sigs(sig: Any) -> list[dict[str, Any]]:
    """Tensor signatures in argument order (lists flattened)."""
    out: list[dict[str, Any]] = []
    if isinstance(sig, dict) and "tensor" in sig and isinstance(sig["tensor"], dict):
        out.append(sig["tensor"])
    elif isinstance(sig, list):
        for item in sig:
            out.extend(_tensor_sigs(item))
    elif isinstance(sig, dict):
        for item in sig.values():
            out.extend(_tensor_sigs(item))
    return out


def record_stem(op: str, args_sig: Any) -> str:
    """``<Op>_<dtype>_<layout>_<shape>`` for a record file (file-system safe, bounded length)."""
    tensors = _tensor_sigs(args_sig)
    if tensors:
        first = tensors[0]
        dtype, layout = first["dtype"], first["layout"]
        shape = "_".join("x".join(str(d) for d in t["shape"]) or "scalar" for t in tensors)
    else:
        dtype, layout, shape = "none", "none", "noinput"
    stem = _UNSAFE.sub("-", f"{op}_{dtype}_{layout}_{shape}")
    if len(stem) > MAX_STEM:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:8]
        stem = f"{stem[:MAX_STEM - 10]}_h{digest}"
    return stem


def node_record(node: fx.Node) -> dict[str, Any]:
    """The signature of one operator call: operator, argument signatures, output signature."""
    return {
        "op": target_name(node.target),
        "schema": str(getattr(node.target, "_schema", "")) or None,
        "args": value_signature(list(node.args)),
        "kwargs": value_signature(dict(node.kwargs)),
        "outputs": value_signature(node.meta.get("val")),
    }


class ShapeRecorder:
    """Writes the records of one process into ``<run_dir>/<pid>/`` and ``<run_dir>/<pid>_debug/``."""

    def __init__(self, run_dir: Path, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.dir = Path(run_dir) / str(self.pid)
        self.debug_dir = Path(run_dir) / f"{self.pid}_debug"
        self._by_digest: dict[str, str] = {}  # signature digest -> file name
        self._stem_count: dict[str, int] = {}
        self._debug: dict[str, dict[str, Any]] = {}  # file name -> full record
        self.occurrences = 0

    @property
    def files(self) -> list[str]:
        return sorted(self._by_digest.values())

    def record_graph(self, gm: fx.GraphModule, graph_name: str, graph_hash: str) -> int:
        """Record every operator node of ``gm``; returns how many new distinct signatures were written."""
        from superkernel.ir.graph import node_scope

        new_files: set[str] = set()
        touched: set[str] = set()
        for index, node in enumerate(gm.graph.nodes):
            if not is_operator_node(node):
                continue
            record = node_record(node)
            blob = json.dumps(record, sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()
            name = self._by_digest.get(digest)
            if name is None:
                stem = record_stem(record["op"], [record["args"], record["kwargs"]])
                n = self._stem_count.get(stem, 0)
                self._stem_count[stem] = n + 1
                name = f"{stem}_{n}.json"
                self._by_digest[digest] = name
                self._debug[name] = {**record, "signature_sha256": digest, "occurrences": []}
                new_files.add(name)
            try:
                scope = node_scope(node)[0] or None
            except Exception:  # noqa: BLE001 - the label is informative only
                scope = None
            stack = node.meta.get("stack_trace")
            self._debug[name]["occurrences"].append({
                "graph": graph_name, "graph_hash": graph_hash, "node": node.name, "index": index,
                "scope": scope, "source": stack.strip().splitlines()[-1].strip() if stack else None,
            })
            self.occurrences += 1
            touched.add(name)
        if not touched:
            return 0
        make_dirs(self.dir, "shape record folder")
        make_dirs(self.debug_dir, "shape record folder")
        for name in sorted(new_files):
            record = {k: v for k, v in self._debug[name].items() if k != "occurrences"}
            atomic_write(self.dir / name, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode(), durable=True)
        for name in sorted(touched):
            full = dict(self._debug[name])
            full["count"] = len(full["occurrences"])
            atomic_write(self.debug_dir / name, (json.dumps(full, indent=1, sort_keys=True) + "\n").encode(), durable=True)
        return len(new_files)
