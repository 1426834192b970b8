"""The input, run in ONNX Runtime before anything is fused: can it run, and does it give the same outputs twice?

Verification compares the fused model with the original on the same inputs, so it can only blame the fusion
when the original itself runs and is deterministic. Otherwise a bad *input* would be reported as a failed
*fused model* (exit 1): an operator in a domain ONNX Runtime does not know fails to load in both, and an
export that kept ``Dropout`` in training mode differs from itself. :func:`check_input` runs the original
twice, as verification will (same seeded inputs, no graph optimization), and raises :class:`InputError`
(exit 2) naming the operator, or the outputs that moved and why when it can tell.

A quantized model whose quantization ONNX Runtime's CPU provider cannot run (``MatMulNBits`` with 3-bit
weights or a block size below 16, ``DequantizeLinear`` of float4, a type a quantized kernel does not take)
fails to load without saying which node is at fault (a kernel constructor's check names only its source
line). :func:`quantization_failures` then loads each quantized node alone, and the refusal names the node,
its attributes and input types, ONNX Runtime's reason and the types its CPU kernels take.
"""

from __future__ import annotations

import re
from typing import Mapping

import onnx_ir as ir

from . import quant as Q
from ._util import scalar
from .modelio import InputError

#: Operators whose output is random by definition (ONNX Runtime draws anew on every run, seeded or not).
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                        "Multinomial"})
_DEFAULT_DOMAINS = ("", "ai.onnx")


def _nodes(model: ir.Model):
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _label(node: ir.Node) -> str:
    return f"{node.domain + ':' if node.domain else ''}{node.op_type}" + (f" (node {node.name!r})" if node.name else "")


def unknown_operators(model: ir.Model, kernels: set[tuple[str, str]] | None = None) -> list[str]:
    """Operators outside the ONNX default domain that ONNX Runtime's CPU provider has no kernel for (a domain it
    does not know, or an operator its domain lacks), each as a phrase naming operator and domain. Operators of the
    model's own functions are known. ``kernels``: (domain, op type) pairs; default: the installed ONNX Runtime's."""
    if kernels is None:
        from onnxruntime.capi import _pybind_state

        kernels = {(k.domain, k.op_name) for k in _pybind_state.get_all_opkernel_def()}
    domains = {d for d, _ in kernels}
    functions = {(f.domain, f.name) for f in model.functions.values()}
    out: list[str] = []
    for node in _nodes(model):
        key = (node.domain, node.op_type)
        if node.domain in _DEFAULT_DOMAINS or key in kernels or key in functions:
            continue
        where = (f"domain {node.domain!r}, which ONNX Runtime does not know" if node.domain not in domains else
                 f"domain {node.domain!r}, which has no such operator in ONNX Runtime")
        phrase = f"operator {_label(node)} is in {where}"
        if phrase not in out:
            out.append(phrase)
    return out


def randomness(model: ir.Model) -> list[str]:
    """Why the model may give other outputs on every run: random operators, Dropout in training mode."""
    out = []
    for node in _nodes(model):
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        if node.op_type in RANDOM_OPS:
            out.append(f"{_label(node)} draws random values")
        elif node.op_type == "Dropout" and len(node.inputs) >= 3 and node.inputs[2] is not None:
            mode = node.inputs[2]
            value = scalar(mode)
            if value is None and mode.is_graph_input():
                out.append(f"{_label(node)} takes its training_mode from the graph input {mode.name!r}")
            elif value:
                out.append(f"{_label(node)} is in training mode (training_mode = true: an export in training mode)")
    return out


PROBE_MAX_BYTES = 256 << 20  # a quantized node whose constant inputs are larger is not loaded alone


def _cpu_kernels() -> list:
    from onnxruntime.capi import _pybind_state

    return [k for k in _pybind_state.get_all_opkernel_def() if k.provider == "CPUExecutionProvider"]


def kernel_types(domain: str, op: str, opset: int, kernels: list | None = None) -> str:
    """The types ONNX Runtime's CPU kernels for ``domain::op`` at ``opset`` take, e.g.
    ``T1 in {int8, uint8}, T2 in {float}`` ('' when it has none)."""
    want = "" if domain in _DEFAULT_DOMAINS else domain
    found: dict[str, list[str]] = {}
    for k in kernels if kernels is not None else _cpu_kernels():
        lo, hi = k.version_range
        if k.op_name != op or k.domain != want or not lo <= max(opset, 1) <= hi:
            continue
        for name, types in k.type_constraints.items():
            bucket = found.setdefault(name, [])
            bucket += [t[len("tensor("):-1] if t.startswith("tensor(") else t for t in types if t not in bucket]
    return ", ".join(f"{n} in {{{', '.join(dict.fromkeys(ts))}}}" for n, ts in sorted(found.items()))


def _ort_reason(message: str) -> str:
    """ONNX Runtime's error without its status prefix and C++ source location."""
    text = " ".join(str(message).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^(Exception during initialization|This is an invalid model)[.:] ", "", text)
    text = re.sub(r"^\S+\.(?:cc|h|cpp|hpp):\d+ \S.*?\)(?: const)? (?:\[with [^\]]*\] )?", "", text)
    return text[:240]


def _attrs(node: ir.Node) -> str:
    out = []
    for name, a in node.attributes.items():
        if a.type in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
            out.append(f"{name}={a.value}")
    return ", ".join(out)


def _probe_model(node: ir.Node, model: ir.Model) -> bytes | None:
    """``node`` alone as a model (its constant inputs as initializers, the others as graph inputs, names
    kept), or None when an input's type is unknown or its constants are too large to copy."""
    inputs, inits, args = [], [], []
    made: dict[int, ir.Value] = {}
    size = 0
    for i, v in enumerate(node.inputs):
        if v is None or id(v) in made:
            args.append(None if v is None else made[id(v)])
            continue
        name = v.name or f"input{i}"
        const = v.const_value
        if const is None and v.producer() is not None and v.producer().op_type == "Constant":
            attr = v.producer().attributes.get("value")
            const = attr.value if attr is not None and attr.type == ir.AttributeType.TENSOR else None
        if const is not None:
            size += const.nbytes
            if size > PROBE_MAX_BYTES:
                return None
            try:
                arr = const.numpy()
            except Exception:  # noqa: BLE001 - external data that cannot be read
                return None
            nv = ir.Value(name=name, type=ir.TensorType(const.dtype), shape=ir.Shape(list(const.shape)),
                          const_value=ir.tensor(arr, dtype=const.dtype, name=name))
            inits.append(nv)
        else:
            if v.type is None:
                return None
            nv = ir.Value(name=name, type=v.type, shape=v.shape)
            inputs.append(nv)
        made[id(v)] = nv
        args.append(nv)
    probe = ir.Node(node.domain, node.op_type, args, attributes=list(node.attributes.values()),
                    num_outputs=len(node.outputs), name=node.name or node.op_type)
    outputs = []
    for new, old in zip(probe.outputs, node.outputs):
        if old.name:  # an unnamed output is an optional one the model does not ask for
            new.name, new.type, new.shape = old.name, old.type, old.shape
            outputs.append(new)
    graph = ir.Graph(inputs, outputs, nodes=[probe], initializers=inits, opset_imports=dict(model.opset_imports))
    return ir.serde.serialize_model(ir.Model(graph, ir_version=model.ir_version)).SerializeToString()


def quantization_failures(model: ir.Model) -> list[str]:
    """The quantized nodes ONNX Runtime's CPU provider cannot load, each loaded alone, as phrases naming the
    node, its attributes and input types, ONNX Runtime's reason and the types its CPU kernels take."""
    nodes = [n for n in model.graph if Q.is_quantized(n)]
    if not nodes:
        return []
    from . import shapes as S
    from . import verify as V

    annotations = S.annotate(model)  # the probes need their inputs' types
    out: list[str] = []
    tried: dict[tuple, str | None] = {}
    kernels = None
    try:
        for node in nodes:
            types = tuple(None if v is None else (str(v.dtype.name).lower() if v.dtype is not None else "?")
                          for v in node.inputs)
            key = (node.domain, node.op_type, _attrs(node), types)
            if key not in tried:
                tried[key] = None
                blob = _probe_model(node, model)
                if blob is not None:
                    try:
                        V.session(blob, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL, log_severity=4)
                    except Exception as e:  # noqa: BLE001 - ORT's Fail / InvalidGraph / NotImplemented
                        tried[key] = _ort_reason(e)
            why = tried[key]
            if why is None:
                continue
            if kernels is None:
                kernels = _cpu_kernels()
            opset = model.opset_imports.get(node.domain or "", 1) if node.domain not in _DEFAULT_DOMAINS else \
                model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
            allowed = kernel_types(node.domain, node.op_type, opset, kernels)
            attrs = _attrs(node)
            shown = ", ".join(t or "-" for t in types)
            out.append(f"quantized operator {Q.label(node)} ({attrs + ', ' if attrs else ''}input types {shown}): "
                       f"{why}" + (f" (its CPU kernels take {allowed})" if allowed else ""))
            if len(out) >= 3:
                break
    finally:
        annotations.restore(model)
    return out


def check_input(path: str, model: ir.Model, *, dims: Mapping[str, int], default_dim: int, seed: int,
                atol: float | None = None, rtol: float | None = None) -> None:
    """Refuse (:class:`InputError`) an input ONNX Runtime cannot run, or that differs between two runs on the
    same inputs beyond the verification tolerance (see the module doc)."""
    from superkernel.util import exception_summary

    from . import verify as V

    try:
        sess = V.session(path, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL, log_severity=4)  # we say why
    except Exception as e:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph types
        unknown = unknown_operators(model)
        if unknown:
            raise InputError(f"{path}: ONNX Runtime cannot run the input: {'; '.join(unknown[:3])}"
                             + (f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")) from None
        quantized = quantization_failures(model)
        if quantized:
            raise InputError(f"{path}: ONNX Runtime cannot run the input's quantization on this CPU: "
                             + "; ".join(quantized)) from None
        raise InputError(f"{path}: ONNX Runtime cannot run the input: {exception_summary(e, 300, first_line=False)}"
                         ) from None
    try:
        feeds = V.make_inputs(sess, dims, default_dim, seed)
        names = [o.name for o in sess.get_outputs()]
        first = sess.run(names, feeds)
        second = sess.run(names, feeds)
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: the input does not run in ONNX Runtime on random inputs: "
                         f"{exception_summary(e, 300, first_line=False)}") from None
    moved = [c for c in (V.compare(n, a, b, atol, rtol) for n, a, b in zip(names, first, second)) if not c.ok]
    if moved:
        why = randomness(model)
        raise InputError(
            f"{path}: the input is not deterministic: two runs in ONNX Runtime on the same inputs differ ("
            + ", ".join(f"output {c.name!r}: max |diff| {c.max_abs_diff:.3g}" for c in moved[:3]) + "), so no fused "
            "model can be verified against it"
            + (f"; {'; '.join(why[:3])}" if why else "") + " (export the model for inference, or pass --no-verify)")
