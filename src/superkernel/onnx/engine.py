"""Matching and rewriting: find candidates with the catalog's patterns, estimate each with
the benefit model, keep the non-overlapping positive ones, rewrite the graph."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import onnx_ir as ir
import onnx_ir.passes.common as irp
import onnxscript.optimizer
from onnxscript.rewriter import pattern

from . import benefit as B
from . import shapes as S
from . import _util as U
from . import quant as Q
from .catalog import RuleSpec
from .rules import MS, FusionPattern
from superkernel.util import exception_summary

MIN_MEASURED_GAIN = 0.02  # a calibrated fusion is kept when its micro-benchmark is >= 2 % faster
OTHER_USES = "Matched nodes have other uses preventing replacement."
FUSED_FROM_KEY = "superkernel.fused_from"
RULE_KEY = "superkernel.rule"


@dataclass
class Candidate:
    rule: str
    variant: str
    fused_op: str
    root: str
    nodes: list[str]
    benefit: B.Benefit | None = None
    status: str = "candidate"  # applied | skipped
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    measured: Any = None  # calibrate.Measurement when the candidate was micro-benchmarked

    @property
    def score_us(self) -> float:
        """What the choice ranks by: the measured saving when calibrated, else the estimate."""
        if self.measured is not None:
            return self.measured.saved_us
        return self.benefit.net_us if self.benefit else 0.0

    @property
    def keep(self) -> bool:
        if self.measured is not None:
            return self.measured.fused_us <= (1.0 - MIN_MEASURED_GAIN) * self.measured.unfused_us
        return bool(self.benefit and self.benefit.positive)

    def decision_text(self) -> str:
        est = self.benefit.describe() if self.benefit else "no estimate"
        if self.measured is None:
            return est
        m = self.measured
        return (f"measured fused {m.fused_us:.2f} us vs unfused {m.unfused_us:.2f} us ({m.saved_us:+.2f} us"
                f"{', cached' if m.cached else ''}); predicted {est}")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "variant": self.variant, "fused_op": self.fused_op, "root": self.root,
                "nodes": self.nodes, "status": self.status, "reason": self.reason, "notes": self.notes,
                "benefit": self.benefit.to_dict() if self.benefit else None,
                "measured": self.measured.to_dict() if self.measured is not None else None}


@dataclass
class NearMiss:
    rule: str
    node: str
    op: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "node": self.node, "op": self.op, "reason": self.reason}


@dataclass
class FusionResult:
    candidates: list[Candidate] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    unfixed_dims: list[str] = field(default_factory=list)
    shape_inference: S.Annotations | None = None

    @property
    def applied(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "applied"]

    @property
    def skipped(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "skipped"]

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    @property
    def bytes_saved(self) -> int:
        return sum(c.benefit.bytes_saved for c in self.applied if c.benefit)

    @property
    def net_us(self) -> float:
        return sum(c.benefit.net_us for c in self.applied if c.benefit)


def op_counts(graph: ir.Graph) -> dict[str, int]:
    c = collections.Counter(f"{n.domain + '::' if n.domain not in ('', 'ai.onnx') else ''}{n.op_type}" for n in graph)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


class _Estimator:
    def __init__(self, dims: Mapping[str, int], default_dim: int, cost_model: B.CostModel):
        self.dims, self.default_dim, self.cost_model = dict(dims), default_dim, cost_model
        self.unfixed: set[str] = set()

    def traffic(self, v: ir.Value | None, reads: int | None = None) -> tuple[B.TensorTraffic | None, bool]:
        if v is None or v.dtype is None:
            return None, False
        shape, symbolic = U.concrete_shape(v, self.dims, self.default_dim)
        if shape is None:
            return None, False
        for d in U.dims(v) or []:
            if isinstance(d, str) and d not in self.dims:
                self.unfixed.add(d)
        name = U.dtype_name(v.dtype)
        if name is None:
            return None, symbolic
        return B.TensorTraffic(shape, name, len(v.uses()) if reads is None else reads), symbolic

    def spec_traffic(self, spec, dtype: str | None, reads: int) -> B.TensorTraffic | None:
        if spec is None or dtype is None:
            return None
        if isinstance(spec, ir.Value):
            t, _ = self.traffic(spec, reads)
            return t
        shape = []
        for d in spec:
            if isinstance(d, int):
                shape.append(d)
            else:
                shape.append(int(self.dims.get(d, self.default_dim)) if isinstance(d, str) else self.default_dim)
        return B.TensorTraffic(tuple(shape), dtype, reads)

    def estimate(self, inst: FusionPattern, match, new_nodes, extras=(), extra_outputs=()) -> tuple[B.Benefit, list[str]]:
        """``extras``: nodes outside the pattern that die with it (e.g. the projections a
        packed attention absorbs); their outputs count as removed intermediates, except
        ``extra_outputs`` (values the replacement provides anew, e.g. the Split outputs
        standing for the MatMuls a weight concatenation absorbs)."""
        notes: list[str] = []
        all_nodes = list(dict.fromkeys([*extras, *match.nodes]))  # a node matched twice counts once
        matched = set(all_nodes)
        outputs = [*match.outputs, *extra_outputs]
        removed, dynamic = [], False
        for n in all_nodes:
            for v in n.outputs:
                if v in outputs or not (v.uses() or v.is_graph_output()):
                    continue
                t, sym = self.traffic(v)
                dynamic |= sym
                if t is None:
                    notes.append(f"shape of {v.name} unknown: not counted")
                else:
                    removed.append(t)
        boundary: list[ir.Value] = []
        for n in all_nodes:
            for v in n.inputs:
                if v is None or v in boundary or (v.producer() in matched) or v.const_value is not None:
                    continue
                boundary.append(v)
        io = []
        for v in [*boundary, *outputs]:
            t, sym = self.traffic(v, 1)
            dynamic |= sym
            if t is not None:
                io.append(t)
        hints = inst.benefit_hints(dict(match.bindings))
        added = []
        for spec, dtype, reads in hints.get("added", []):
            t = self.spec_traffic(spec, dtype, reads)
            if t is not None:
                added.append(t)
        row_bytes = 0
        row = hints.get("row")
        if row is not None and U.last_dim(row) and row.dtype is not None and U.dtype_name(row.dtype):
            row_bytes = B.tensor_nbytes((U.last_dim(row),), U.dtype_name(row.dtype))
        ops_added = runtime_ops(new_nodes)
        b = B.estimate_benefit(removed, len(all_nodes), ops_added, added=added, fused_io=io, row_bytes=row_bytes,
                               dynamic_shapes=dynamic, model=self.cost_model)
        return b, notes


def runtime_ops(nodes) -> int:
    """Nodes that will still run after constant folding (Constant nodes, Shape of a static
    shape and anything computed only from those are folded away)."""
    static: set[ir.Value] = set()
    count = 0
    for n in nodes:
        is_static = False
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            is_static = True
        elif n.op_type == "Shape" and n.domain in ("", "ai.onnx"):
            d = U.dims(n.inputs[0])
            is_static = d is not None and all(isinstance(x, int) for x in d)
        elif n.domain in ("", "ai.onnx") and n.inputs and all(
                v is None or v in static or v.const_value is not None for v in n.inputs):
            is_static = True
        if is_static:
            static.update(n.outputs)
        else:
            count += 1
    return count


def _fresh_replacement(rw: pattern.RewriteRule, model: ir.Model, graph: ir.Graph, node: ir.Node):
    match = rw.match(model, graph, node, check_nodes_are_removable=True)
    if not match:
        return match, None
    delta = rw._replacement_pattern.get_replacement(match)  # onnxscript: builds the new nodes
    return match, delta


def _root_op(rw: pattern.RewriteRule) -> str | None:
    """The op type a rule's pattern is rooted at (the node the matcher starts from), or None
    when the pattern does not fix it."""
    try:
        op = rw._target_pattern.output_nodes[0].op
    except (AttributeError, IndexError):
        return None
    value = getattr(op, "value", None)
    return value() if callable(value) and type(op).__name__ == "StringConstantPattern" else None


def _by_root_op(built: list) -> Callable[[str], list]:
    """``for_op(op_type)``: the rules that can match at a node of that type, in catalog order
    (the matcher would reject the others at the root; trying them costs most of the time)."""
    roots = [_root_op(item[2]) for item in built]
    cache: dict[str, list] = {}

    def for_op(op_type: str) -> list:
        if op_type not in cache:
            cache[op_type] = [item for item, r in zip(built, roots) if r is None or r == op_type]
        return cache[op_type]

    return for_op


def _detach(nodes) -> None:
    """Drop the uses that replacement nodes built but not inserted hold on graph values
    (otherwise they look like extra consumers to later matches)."""
    for n in nodes:
        for i in range(len(n.inputs)):
            if n.inputs[i] is not None:
                n.replace_input_with(i, None)


def fuse(model: ir.Model, specs: list[RuleSpec], *, dims: Mapping[str, int] | None = None, default_dim: int = 1,
         debug: bool = False, cost_model: B.CostModel = B.CPU_DEFAULT,
         progress: Callable[[str, int, int], None] | None = None, infer_shapes: bool = True,
         calibrator=None) -> FusionResult:
    """Fuse ``model`` in place with the rules in ``specs``; return what was found and done.

    With ``infer_shapes`` the dtypes and shapes the model does not declare are inferred
    first (:mod:`superkernel.onnx.shapes`) and cleared again at the end. With a
    ``calibrator`` (:class:`superkernel.onnx.calibrate.Calibrator`) every candidate is
    micro-benchmarked and kept only when measured faster; otherwise the estimate decides."""
    graph = model.graph
    result = FusionResult(ops_before=op_counts(graph))
    if infer_shapes and specs:
        result.shape_inference = S.annotate(model)
    est = _Estimator(dims or {}, default_dim, cost_model)
    onnxscript.optimizer.basic_constant_propagation(graph)
    stages = sorted({s.stage for s in specs})
    counter = collections.Counter()
    seen_near: set[tuple[str, str, str]] = set()
    decided: set[tuple[str, str]] = set()  # (rule, root) skipped in an earlier round: not re-measured
    for si, stage in enumerate(stages):
        stage_specs = [s for s in specs if s.stage == stage]
        if progress:
            progress(", ".join(s.name for s in stage_specs), si, len(stages))
        built = [(spec, inst, rw) for spec in stage_specs for inst, rw in spec.build()]
        for_op = _by_root_op(built)
        for _round in range(4):
            found: list[tuple[Candidate, RuleSpec, FusionPattern, pattern.RewriteRule, ir.Node, set]] = []
            for node in list(graph):
                for spec, inst, rw in for_op(node.op_type):
                    match, delta = _fresh_replacement(rw, model, graph, node)
                    if match is None:
                        continue
                    if not match:
                        if match.reason == OTHER_USES:
                            key = (spec.name, node.name or "", "other uses")
                            if key not in seen_near:
                                seen_near.add(key)
                                result.near_misses.append(NearMiss(
                                    spec.name, node.name or "", node.op_type,
                                    "an intermediate of the pattern has a consumer outside it (or is a graph output)"))
                        continue
                    if delta is None:
                        continue
                    if (spec.name, node.name or "") in decided or any(
                            c[4] is node and c[1].name == spec.name for c in found):
                        _detach(delta.new_nodes)
                        continue  # another variant of the same rule at the same root
                    extras = [n for n in inst.state.get("extra_nodes", []) if n not in match.nodes]
                    hit = Q.guard([*match.nodes, *extras])
                    if hit is not None:  # never a quantized node into something ONNX Runtime runs in float
                        _detach(delta.new_nodes)
                        key = (spec.name, node.name or "", "quantized")
                        if key not in seen_near:
                            seen_near.add(key)
                            result.near_misses.append(NearMiss(
                                spec.name, node.name or "", node.op_type,
                                f"leaves the quantized subgraph alone: {hit[1]}"))
                        continue
                    cand = Candidate(spec.name, inst.variant, spec.fused_op, node.name or "",
                                     [n.name or n.op_type for n in dict.fromkeys(match.nodes)])
                    also = inst.state.get("also_replaces", [])
                    cand.benefit, cand.notes = est.estimate(inst, match, delta.new_nodes, extras,
                                                            [old for old, _new in also])
                    if extras:
                        cand.nodes = [n.name or n.op_type for n in extras] + cand.nodes
                    if calibrator is not None:
                        _calibrate(calibrator, cand, model, match, delta, extras, also)
                    _detach(delta.new_nodes)
                    found.append((cand, spec, inst, rw, node, set(match.nodes) | set(extras)))
            for spec, inst, rw in built:
                for n, why in inst.near_misses:
                    key = (spec.name, n.name or "", why)
                    if key not in seen_near:
                        seen_near.add(key)
                        result.near_misses.append(NearMiss(spec.name, n.name or "", n.op_type, why))
                inst.near_misses.clear()
            if not found:
                break
            # choose: best net benefit first, no node in two fusions
            taken: set[ir.Node] = set()
            owner: dict[ir.Node, Candidate] = {}
            chosen = []
            for item in sorted(found, key=lambda it: -it[0].score_us):
                cand, nodes = item[0], item[5]
                if not cand.keep:
                    cand.status = "skipped"
                    cand.reason = (f"not faster when measured: {cand.decision_text()}" if cand.measured is not None
                                   else f"net benefit not positive: {cand.benefit.describe()}")
                    continue
                clash = nodes & taken
                if clash:
                    other = owner[next(iter(clash))]
                    cand.status = "skipped"
                    cand.reason = (f"overlaps {other.rule} at {other.root} "
                                   f"(net {other.score_us:+.3f} us >= {cand.score_us:+.3f} us)")
                    continue
                taken |= nodes
                for n in nodes:
                    owner[n] = cand
                chosen.append(item)
            result.candidates.extend(it[0] for it in found)
            decided.update((it[0].rule, it[0].root) for it in found if it[0].status == "skipped")
            applied_now = 0
            for cand, spec, inst, rw, node, _nodes in chosen:
                if node.graph is not graph:
                    cand.status, cand.reason = "skipped", "root node removed by an earlier fusion"
                    continue
                match, delta = _fresh_replacement(rw, model, graph, node)
                inst.near_misses.clear()
                if not match or delta is None:
                    if delta is not None:
                        _detach(delta.new_nodes)
                    cand.status, cand.reason = "skipped", "no longer matches after an earlier fusion in this stage"
                    continue
                main = _main_node(delta)
                if main is not None:
                    cand.fused_op = (f"{main.domain}::" if main.domain not in ("", "ai.onnx") else "") + main.op_type
                _apply(model, graph, node, match, delta, spec, counter, debug, cand.nodes,
                       inst.state.get("also_replaces", []))
                cand.status = "applied"
                cand.reason = "measured faster" if cand.measured is not None else "positive net benefit"
                applied_now += 1
            if applied_now:
                graph.sort()
                irp.RemoveUnusedNodesPass()(model)  # nodes that died with a fusion (absorbed projections)
            else:
                break
    fused_at = {(c.rule, c.root) for c in result.candidates}
    result.near_misses = [m for m in result.near_misses if (m.rule, m.node) not in fused_at]
    if any(s.name == "attention" for s in specs):  # forms no rule fuses: named, with the reason
        from .unfusable import near_misses as unfusable

        result.near_misses += [NearMiss("attention", n.name or "", n.op_type, why) for n, why in unfusable(graph)]
    if result.applied:
        _cleanup(model)
    if result.shape_inference is not None:
        result.shape_inference.restore(model)
    if calibrator is not None:
        calibrator.save()
    result.ops_after = op_counts(graph)
    result.unfixed_dims = sorted(est.unfixed)
    return result


def _main_node(delta) -> ir.Node | None:
    """The fused operator a replacement stands for: the contrib-domain node nearest to its
    first output (a Reshape/Transpose after it or a RotaryEmbedding before it are helpers)."""
    new = set(delta.new_nodes)
    seen, frontier = set(), [delta.new_outputs[0].producer()]
    while frontier:
        n = frontier.pop(0)
        if n is None or n in seen or n not in new:
            continue
        if n.domain == MS:
            return n
        seen.add(n)
        frontier.extend(v.producer() for v in n.inputs if v is not None)
    return next((n for n in delta.new_nodes if n.domain == MS), None) or delta.new_outputs[0].producer()


def _calibrate(calibrator, cand: Candidate, model: ir.Model, match, delta, extras=(), also=()) -> None:
    """``also``: (old value, new value) pairs replaced besides the match's outputs."""
    opsets = {d: v for d, v in model.opset_imports.items() if d not in ("ai.onnx",)}
    opsets.setdefault("", 17)
    opsets.setdefault(MS, 1)
    order = {n: i for i, n in enumerate(model.graph)}
    nodes = sorted(dict.fromkeys([*extras, *match.nodes]), key=lambda n: order.get(n, -1))  # topological
    built = calibrator.micro_models(nodes,
                                    [*match.outputs, *(old for old, _ in also)], delta.new_nodes,
                                    [*delta.new_outputs, *(new for _, new in also)], opsets)
    if isinstance(built, str):
        cand.notes.append(f"not calibrated: {built}; the estimate decides")
        return
    try:
        cand.measured = calibrator.calibrate(*built)
    except Exception as e:  # noqa: BLE001 - e.g. ORT rejects the micro-model; the estimate decides
        cand.notes.append(f"not calibrated: micro-benchmark failed ({exception_summary(e, 200, first_line=False)}); "
                          "the estimate decides")


def _apply(model, graph, root, match, delta, spec: RuleSpec, counter, debug: bool, replaced: list[str],
           also=()) -> None:
    """Insert the replacement; ``also``: (old, new) values replaced besides the match's
    outputs (their producers, absorbed nodes outside the pattern, are removed)."""
    onnxscript.optimizer.basic_constant_propagation(delta.new_nodes)
    counter[spec.name] += 1
    for i, n in enumerate(delta.new_nodes):
        n.name = f"{spec.name}_{counter[spec.name]}" + (f"_{i}" if len(delta.new_nodes) > 1 else "")
        if n.domain == MS and "com.microsoft" not in model.opset_imports:
            model.opset_imports["com.microsoft"] = 1
            graph.opset_imports["com.microsoft"] = 1
        if n.op_type == "Constant":
            continue
        n.metadata_props[RULE_KEY] = spec.name
        if debug:
            n.metadata_props[FUSED_FROM_KEY] = ",".join(replaced)
            n.doc_string = f"graph-autofusion {spec.name}: replaces {', '.join(replaced)}"
    ir.convenience.replace_nodes_and_values(graph, root, match.nodes, delta.new_nodes, match.outputs,
                                            delta.new_outputs)
    for old, new in also:
        new.type = old.type if old.type is not None else new.type
        new.shape = old.shape if old.shape is not None else new.shape
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        producer = old.producer()
        if producer is not None and producer.graph is graph:
            graph.remove(producer, safe=True)
        new.name = old.name


def _cleanup(model: ir.Model) -> None:
    # Fold the helper constants / static shapes the rewrites introduced, share identical
    # helper subgraphs (e.g. the rotary cache built for q and k), drop dead nodes.
    import logging

    folding_log = logging.getLogger("onnxscript.optimizer._constant_folding")
    level = folding_log.level
    folding_log.setLevel(logging.ERROR)  # a node it cannot evaluate stays as it is; not a user warning
    try:
        from onnxscript.optimizer._constant_folding import DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT as limit

        from .foldsize import should_fold_ir

        onnxscript.optimizer.fold_constants(model, onnx_shape_inference=False, output_size_limit=limit,
                                            should_fold=lambda node: should_fold_ir(node, limit))  # sized first
    finally:
        folding_log.setLevel(level)
    irp.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    irp.CommonSubexpressionEliminationPass()(model)
    irp.RemoveUnusedNodesPass()(model)
    irp.RemoveUnusedOpsetsPass()(model)
    irp.TopologicalSortPass()(model)
    irp.NameFixPass()(model)
    # Optional outputs nobody reads get no name, so ONNX Runtime does not compute them
    # (mean / inv_std_dev of the Skip*Normalization ops, present_key/value of GQA).
    # GroupQueryAttention with past_key/past_value must keep its present outputs: ONNX Runtime's
    # CPU kernel gives wrong results without them.
    for n in model.graph:
        if n.domain == MS and n.op_type == "GroupQueryAttention" and len(n.inputs) > 3 and n.inputs[3] is not None:
            continue
        if n.domain == MS and n.op_type in _OPTIONAL_OUTPUT_OPS:
            for v in n.outputs[1:]:
                if not v.uses() and not v.is_graph_output():
                    v.name = ""


_OPTIONAL_OUTPUT_OPS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupQueryAttention"}
