"""Shape and type inference before matching.

Most ONNX files carry no ``value_info`` (the TorchScript exporter, ``dynamo=False``, writes
none), so the rules would see intermediate values of unknown dtype and rank. Before
matching, :func:`annotate` runs ONNX's own shape inference (with data propagation) on a
proto copy of the model, and ONNX Runtime's symbolic shape inference where values stay
unknown or dims are symbolic, and copies the inferred dtype/shape onto the values of the
in-memory model that had none. Tensors in external data stay references: the proto copy
never loads the weights, so this works for models of any size.

The inferred annotations are used for matching only: :meth:`Annotations.restore` clears
them again before the fused model is written, so the output keeps the user's graph
(apart from the fusions) and no guessed shape ends up in a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx_ir as ir

from superkernel.util import exception_summary

from ._util import reference_run
from .foldsize import data_prop_is_bounded, fold_size_bound

SYMBOLIC_MAX_BYTES = 1 << 30  # symbolic inference needs the weights in memory; skip above 1 GiB of proto


@dataclass
class Annotations:
    """What inference added, and how to take it back."""

    onnx_inferred: int = 0
    symbolic_inferred: int = 0
    still_unknown: int = 0
    notes: list[str] = field(default_factory=list)
    added: set[str] = field(default_factory=set)  # value names whose type/shape came from inference
    # values that had a declared shape with unresolved dims (``unk__N`` written by an earlier symbolic
    # inference, e.g. ONNX Runtime's quantizer saves its value_info) that inference resolved: what was declared
    replaced: dict[str, tuple] = field(default_factory=dict)

    def restore(self, model: ir.Model) -> int:
        """Clear the inferred type/shape of intermediate values (graph inputs/outputs keep
        theirs) and put back the declared shapes inference had improved. Returns how many
        values were restored."""
        if not self.added:
            return 0
        outs = set(model.graph.outputs)
        n = 0
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            for v in node.outputs:
                if v.name in self.replaced:
                    v.type, v.shape = self.replaced[v.name]
                    n += 1
                elif v.name in self.added and v not in outs:
                    v.shape = None
                    v.type = None
                    n += 1
        return n

    def to_dict(self) -> dict:
        return {"onnx_inferred": self.onnx_inferred, "symbolic_inferred": self.symbolic_inferred,
                "still_unknown": self.still_unknown, "notes": self.notes}


def _known(v: ir.Value) -> bool:
    return v.type is not None and v.shape is not None


def _unresolved(v: ir.Value) -> bool:
    """A declared shape with dims nobody named: missing, or ``unk__N`` (an earlier symbolic inference's name for
    a dim it could not resolve; ONNX Runtime's quantizer saves such value_info with the quantized model)."""
    return v.shape is not None and any(
        not isinstance(d, int) and (d is None or d.value is None or str(d.value).startswith("unk__"))
        for d in v.shape)


def _declared_score(v: ir.Value) -> int:
    """:func:`_score` of what ``v`` declares."""
    if v.type is None:
        return -1
    if v.shape is None:
        return 0
    return 1 + sum(2 if isinstance(d, int) else 1 if d.value is not None and not str(d.value).startswith("unk__")
                   else 0 for d in v.shape)


def _score(vi: onnx.ValueInfoProto) -> int:
    """How much a ValueInfoProto knows: -1 nothing, else 1 + number of known dims."""
    t = vi.type
    if not t.HasField("tensor_type") or t.tensor_type.elem_type == 0:
        return -1
    if not t.tensor_type.HasField("shape"):
        return 0
    # a concrete dim counts more than a named one (symbolic inference names unknowns unk__N)
    return 1 + sum(2 if d.HasField("dim_value") else 1 if _named(d) else 0 for d in t.tensor_type.shape.dim)


def _named(d) -> bool:
    """A symbolic dim with a real name (inference names the dims it could not resolve unk__N)."""
    return d.HasField("dim_param") and not d.dim_param.startswith("unk__")


def _value_infos(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    g = proto.graph
    return {vi.name: vi for vi in [*g.value_info, *g.output] if vi.name}


def annotate(model: ir.Model, *, symbolic: bool = True) -> Annotations:
    """Infer dtypes and shapes of the values of ``model`` that have none (in place, on the
    in-memory model only). Never raises: a failing inference is recorded as a note."""
    ann = Annotations()
    values: dict[str, ir.Value] = {}
    for node in model.graph:  # top-level graph: the rules match there
        for v in node.outputs:
            if v.name:
                values[v.name] = v
    missing = {n for n, v in values.items() if not _known(v)}
    poor = {n for n, v in values.items() if _known(v) and _unresolved(v)}  # declared, but inference may do better
    if not missing and not poor:
        return ann
    try:
        proto = ir.to_proto(model)
    except Exception as e:  # noqa: BLE001
        ann.notes.append(f"shape inference skipped: cannot serialize the model ({exception_summary(e, 500, first_line=False)})")
        ann.still_unknown = len(missing)
        return ann
    best: dict[str, tuple[int, onnx.ValueInfoProto, str]] = {}
    # Constant folding on a copy first: shapes computed by Shape/Where/Expand chains (the
    # TorchScript exporter's masks and views) become constants the inference can use.
    try:
        proto = _fold_small_constants(proto)
    except Exception as e:  # noqa: BLE001
        ann.notes.append(f"constant folding before inference failed: {exception_summary(e, 240, first_line=False)}")
    try:
        prop = data_prop_is_bounded(proto)  # ONNX's data propagation materializes what a Range produces
        if not prop:
            ann.notes.append("ONNX data propagation skipped: a Range or a declared dimension is too large to evaluate")
        if poor:  # inference keeps a declared shape as it is: let it infer those values afresh
            _drop_value_info(proto, poor)
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=prop)
        for name, vi in _value_infos(inferred).items():
            if (name in missing or name in poor) and (name not in best or _score(vi) > best[name][0]):
                best[name] = (_score(vi), vi, "onnx")
    except Exception as e:  # noqa: BLE001 - the inference raises for odd models; matching goes on without it
        ann.notes.append(f"ONNX shape inference failed: {exception_summary(e, 240, first_line=False)}")
    incomplete = [n for n in (*missing, *poor) if n not in best or not _complete(best[n][1])]
    if symbolic and incomplete:
        if proto.ByteSize() > SYMBOLIC_MAX_BYTES:
            ann.notes.append("symbolic shape inference skipped: model too large to hold in memory twice")
        else:
            try:
                from .symbolic import infer_symbolic

                sym = infer_symbolic(proto, auto_merge=True)  # no file written, constants sized first
                if sym is not None:
                    for name, vi in _value_infos(sym).items():
                        if name in missing or name in poor:
                            s = _score(vi)
                            if name not in best or s > best[name][0] or (
                                    s == best[name][0] and _complete(vi) and not _complete(best[name][1])):
                                best[name] = (s, vi, "symbolic")
            except Exception as e:  # noqa: BLE001
                ann.notes.append(f"symbolic shape inference failed: {exception_summary(e, 240, first_line=False)}")
    for name in poor:
        entry = best.get(name)
        v = values[name]
        if entry is None or entry[0] <= _declared_score(v) or not entry[1].type.tensor_type.HasField("shape"):
            continue
        ann.replaced[name] = (v.type, v.shape)
        v.shape = None  # set from the inference below
    for name in (*missing, *ann.replaced):
        entry = best.get(name)
        if entry is None or entry[0] < 0:
            ann.still_unknown += 1
            continue
        _, vi, source = entry
        v = values[name]
        tt = vi.type.tensor_type
        if v.type is None:
            v.type = ir.TensorType(ir.DataType(tt.elem_type))
        if v.shape is None and tt.HasField("shape"):
            v.shape = ir.Shape([d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in tt.shape.dim])
        ann.added.add(name)
        if source == "onnx":
            ann.onnx_inferred += 1
        else:
            ann.symbolic_inferred += 1
    return ann


def _drop_value_info(proto: onnx.ModelProto, names: set[str]) -> None:
    """Remove the value_info of ``names`` from ``proto`` (a copy), so that inference computes them."""
    keep = [vi for vi in proto.graph.value_info if vi.name not in names]
    if len(keep) != len(proto.graph.value_info):
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(keep)


def _complete(vi: onnx.ValueInfoProto) -> bool:
    t = vi.type.tensor_type
    return t.elem_type != 0 and t.HasField("shape") and all(d.HasField("dim_value") or _named(d) for d in t.shape.dim)


FOLD_MAX_ELEMENTS = 4096
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def _fold_small_constants(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` in which every default-domain node whose inputs are all small
    constants is replaced by Constant nodes holding its outputs (evaluated with ONNX's
    reference implementation). Only small tensors (shapes, masks of a few elements) are
    evaluated; weights are never read."""
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    known: dict[str, object] = {}
    for init in g.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL and _numel(init.dims) <= FOLD_MAX_ELEMENTS:
            known[init.name] = numpy_helper.to_array(init)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    nodes = []
    changed = False
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        if node.op_type == "Constant":
            try:
                attr = node.attribute[0]
                arr = numpy_helper.to_array(attr.t) if attr.type == onnx.AttributeProto.TENSOR \
                    and _numel(attr.t.dims) <= FOLD_MAX_ELEMENTS else None
            except Exception:  # noqa: BLE001
                arr = None
            if arr is not None and arr.size <= FOLD_MAX_ELEMENTS:
                known[node.output[0]] = arr
            nodes.append(node)
            continue
        if (node.op_type in _NO_FOLD or not node.input or any(i and i not in known for i in node.input)
                or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute)):
            nodes.append(node)
            continue
        feeds = {i: known[i] for i in node.input if i}
        bound = fold_size_bound(node, [known[i] if i else None for i in node.input])
        if bound is None or bound > FOLD_MAX_ELEMENTS:  # sized before it is evaluated, never after
            nodes.append(node)
            continue
        try:
            res = reference_run(node, feeds, opset)  # with the model's opset
        except Exception:  # noqa: BLE001 - not evaluable here; inference treats it as usual
            nodes.append(node)
            continue
        if any(getattr(r, "size", FOLD_MAX_ELEMENTS + 1) > FOLD_MAX_ELEMENTS for r in res if r is not None):
            nodes.append(node)
            continue
        import numpy as np

        for name, r in zip(node.output, res):
            if not name:
                continue
            arr = np.asarray(r)
            known[name] = arr
            nodes.append(onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        changed = True
    if changed:
        del g.node[:]
        g.node.extend(nodes)
    return out


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n
