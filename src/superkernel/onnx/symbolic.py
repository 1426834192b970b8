"""ONNX Runtime's symbolic shape inference, run without writing files and with its constants sized first.

``SymbolicShapeInference.infer_shapes`` saves its model as ``sym_shape_infer_temp.onnx`` into
the current directory when inference is incomplete, and its ``ConstantOfShape`` handler
materializes an int64 constant of whatever shape the model asks for (a 200-byte model can
ask for 12 GB). :func:`infer_symbolic` drives the same steps (``_preprocess``,
``_infer_impl`` until done, ``_update_output_from_vi``) on a subclass whose
``ConstantOfShape`` refuses results above :data:`CONSTANT_MAX_ELEMENTS` before evaluating:
nothing is written anywhere, and the process's working directory is never changed.
When this onnxruntime's class lacks those steps, symbolic inference is not run (a note).
"""

from __future__ import annotations

import math

import onnx

CONSTANT_MAX_ELEMENTS = 1 << 20
_STEPS = ("_preprocess", "_infer_impl", "_update_output_from_vi", "_infer_ConstantOfShape",
          "_get_int_or_float_values")


class SymbolicUnavailable(RuntimeError):
    """This onnxruntime's symbolic shape inference cannot be run bounded (the message says why)."""


def _bounded_class():
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, is_literal

    missing = [s for s in _STEPS if not hasattr(SymbolicShapeInference, s)]
    if missing:
        raise SymbolicUnavailable(f"this onnxruntime's symbolic shape inference lacks {', '.join(missing)}")

    class Bounded(SymbolicShapeInference):
        def _infer_ConstantOfShape(self, node):  # noqa: N802 - ORT's dispatch name
            shape = self._get_int_or_float_values(node)[0]
            dims = shape if isinstance(shape, list) else [shape]
            if shape is not None and all(is_literal(d) for d in dims):
                n = math.prod(max(0, int(d)) for d in dims)
                if n > CONSTANT_MAX_ELEMENTS:
                    raise ValueError(f"ConstantOfShape {node.name or node.output[0]!r} would hold {n} elements "
                                     f"(at most {CONSTANT_MAX_ELEMENTS} are evaluated)")
            return super()._infer_ConstantOfShape(node)

    return Bounded


def infer_symbolic(proto: onnx.ModelProto, *, auto_merge: bool = True) -> onnx.ModelProto:
    """The model with the shapes ONNX Runtime's symbolic inference found (raises when it fails or is
    incomplete, as ``infer_shapes`` does, but writes no file)."""
    from onnxruntime.tools.symbolic_shape_infer import get_opset

    opset = get_opset(proto)
    if not opset or opset < 7:
        raise ValueError("symbolic shape inference needs opset 7 or later")
    inference = _bounded_class()(2**31 - 1, auto_merge, False, 0)
    inference._preprocess(proto)
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise ValueError("incomplete symbolic shape inference")
    return inference.out_mp_


__all__ = ["CONSTANT_MAX_ELEMENTS", "SymbolicUnavailable", "infer_symbolic"]
