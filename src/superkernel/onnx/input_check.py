"""The input, run in ONNX Runtime before anything is fused: can it run, and does it give the same outputs twice?

Verification compares the fused model with the original on the same inputs, so it can only blame the fusion
when the original itself runs and is deterministic. Otherwise a bad *input* would be reported as a failed
*fused model* (exit 1): an operator in a domain ONNX Runtime does not know fails to load in both, and an
export that kept ``Dropout`` in training mode differs from itself. :func:`check_input` runs the original
twice, as verification will (same seeded inputs, no graph optimization), and raises :class:`InputError`
(exit 2) naming the operator, or the outputs that moved and why when it can tell.
"""

from __future__ import annotations

from typing import Mapping

import onnx_ir as ir

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


def check_input(path: str, model: ir.Model, *, dims: Mapping[str, int], default_dim: int, seed: int,
                atol: float | None = None, rtol: float | None = None) -> None:
    """Refuse (:class:`InputError`) an input ONNX Runtime cannot run, or that differs between two runs on the
    same inputs beyond the verification tolerance (see the module doc)."""
    from superkernel.util import exception_summary

    from . import verify as V

    try:
        sess = V.session(path, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    except Exception as e:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph types
        unknown = unknown_operators(model)
        if unknown:
            raise InputError(f"{path}: ONNX Runtime cannot run the input: {'; '.join(unknown[:3])}"
                             + (f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")) from None
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
