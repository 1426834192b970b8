"""Verification: run the original and the fused model in ONNX Runtime on the same seeded
random inputs and compare every output with a per-dtype tolerance.

**Quantized activations.** A model that quantizes activations at run time (``DynamicQuantizeLinear``,
``DynamicQuantizeMatMul``, ``QuantizeLinear`` of a computed value, ``MatMulNBits`` with
``accuracy_level=4``: int8 activations) rounds each activation element to a quantization step. Any
rewrite that changes a float value upstream in its last bit (ONNX Runtime's own optimizer as much as a
fusion) can move an element across a rounding boundary: that element then changes by a whole step,
and the outputs downstream by far more than a float tolerance (1e-3 to 3e-2 on the logits of a
Qwen2-wide decode step with int4 MatMulNBits). For such an input, an output that fails the
elementwise tolerance is held against the input's own **quantization floor**: the same original
run with every activation quantizer's input perturbed by a relative ``ACTIVATION_NOISE`` (1e-6, a few
float32 ulps: the size of a fusion's rounding difference), ``FLOOR_DRAWS`` draws; the floor of an
output is the largest difference any draw makes. The output passes when its difference from the
original is no larger (the check says so, with both numbers). A wrong fusion moves outputs by O(1),
orders of magnitude above any floor. The float tolerance still applies on top (``atol + rtol * max |ref|``).
Explicit ``--atol`` / ``--rtol`` turn the floor off.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
import onnxruntime as ort

from .timing import session, time_interleaved  # noqa: F401 - re-exported (one session builder, one loop)

# (atol, rtol) per output dtype; an element passes when |a - b| <= atol + rtol * |a|.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-6),
    "float32": (1e-4, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (3e-2, 3e-2),
}
EXACT = (0.0, 0.0)  # integers and bool must match exactly
VERIFY_DEFAULT_DIM = 3  # unfixed symbolic dims in verification inputs (odd, exercises broadcasting)

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def make_inputs(sess: ort.InferenceSession, dims: Mapping[str, int], default_dim: int, seed: int) -> dict:
    """Seeded inputs: floats ~ N(0, 1); integer inputs named like a mask are 0/1 (first
    position 1), like positions are increasing positions, other integers are in [0, 2)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else int(dims.get(d, default_dim)) if isinstance(d, str)
                 else default_dim for d in i.shape]
        dt = _ORT_TYPES.get(i.type)
        if dt is None:
            raise ValueError(f"input {i.name}: type {i.type} not supported for random inputs")
        name = i.name.lower()
        if np.issubdtype(dt, np.floating):
            a = rng.standard_normal(shape).astype(dt)
        elif dt is np.bool_:
            a = rng.random(shape) > 0.5
        elif "mask" in name:
            a = (rng.random(shape) > 0.25).astype(dt)
            if a.ndim >= 1 and a.shape[-1] > 0:
                a[..., 0] = 1
        elif "position" in name and len(shape) >= 1:
            a = np.broadcast_to(np.arange(shape[-1]), shape) + rng.integers(0, 4, shape[:-1] + [1])
            a = a.astype(dt)
        else:
            a = rng.integers(0, 2, shape).astype(dt)
        feeds[i.name] = a
    return feeds


@dataclass
class OutputCheck:
    name: str
    dtype: str
    shape: list[int]
    max_abs_diff: float
    max_rel_diff: float
    atol: float
    rtol: float
    ok: bool
    reason: str = ""
    quantization_floor: float | None = None  # set when the output was judged against it


@dataclass
class VerifyResult:
    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    inputs: dict[str, list[int]] = field(default_factory=dict)
    seed: int = 0
    floor_note: str = ""  # whether, and how, outputs were held against the quantization floor

    @property
    def failed(self) -> list[OutputCheck]:
        return [o for o in self.outputs if not o.ok]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seed": self.seed, "inputs": self.inputs,
                "outputs": [asdict(o) for o in self.outputs], "quantization_floor": self.floor_note}


def tolerance(dtype: str, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    a, r = TOLERANCES.get(dtype, EXACT)
    return (a if atol is None else atol), (r if rtol is None else rtol)


def compare(name: str, a: np.ndarray, b: np.ndarray, atol: float | None = None, rtol: float | None = None) -> OutputCheck:
    dtype = str(a.dtype)
    at, rt = tolerance(dtype, atol, rtol)
    if a.shape != b.shape:
        return OutputCheck(name, dtype, list(a.shape), float("inf"), float("inf"), at, rt, False,
                           f"shape {list(b.shape)} != {list(a.shape)}")
    if a.size == 0:
        return OutputCheck(name, dtype, list(a.shape), 0.0, 0.0, at, rt, True)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(af) & np.isnan(bf)
    diff = np.where(both_nan, 0.0, np.abs(af - bf))
    diff = np.where(np.isnan(diff), np.inf, diff)
    rel = diff / np.maximum(np.abs(af), 1e-12)
    ok = bool(np.all(diff <= at + rt * np.abs(np.where(np.isnan(af), 0, af))))
    reason = "" if ok else f"max |diff| {diff.max():.3g} above atol {at:g} + rtol {rt:g} * |ref|"
    return OutputCheck(name, dtype, list(a.shape), float(diff.max()), float(rel.max()), at, rt, ok, reason)


ACTIVATION_NOISE = 1e-6  # relative perturbation of each activation quantizer's input for the floor
FLOOR_DRAWS = 3
FLOOR_MAX_BYTES = 2 << 30  # the perturbed copy is built in memory (one protobuf)
_DEFAULT = ("", "ai.onnx")


def activation_quantizers(proto) -> list[tuple[int, int]]:
    """(node index, input index) of every place the main graph of ``proto`` (an ``onnx.ModelProto``)
    rounds a computed float value to integers at run time."""
    consts = {t.name for t in proto.graph.initializer}
    consts |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    out = []
    for i, n in enumerate(proto.graph.node):
        if not n.input or not n.input[0] or n.input[0] in consts:
            continue
        op, dom = n.op_type, n.domain
        level = next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
        if (dom in _DEFAULT and op in ("DynamicQuantizeLinear", "QuantizeLinear")) or (
                dom == "com.microsoft" and (op in ("DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QuantizeLinear")
                                            or (op == "MatMulNBits" and level == 4))):
            out.append((i, 0))
    return out


def _perturbed(proto, places: list[tuple[int, int]], draw: int) -> bytes:
    """``proto`` with each input in ``places`` replaced by x * (1 + u), u ~ U(-ACTIVATION_NOISE, +ACTIVATION_NOISE)
    elementwise (RandomUniformLike, seeded per place and draw)."""
    import onnx

    p = onnx.ModelProto()
    p.CopyFrom(proto)
    nodes = list(p.graph.node)
    extra: dict[int, list] = {}
    for k, (ni, ii) in enumerate(places):
        node = nodes[ni]
        x = node.input[ii]
        tag = f"__sk_floor_{draw}_{k}"
        extra[ni] = extra.get(ni, []) + [
            onnx.helper.make_node("RandomUniformLike", [x], [tag + "_u"], low=-ACTIVATION_NOISE, high=ACTIVATION_NOISE,
                                  seed=float(1 + 7919 * draw + k)),
            onnx.helper.make_node("Mul", [x, tag + "_u"], [tag + "_d"]),
            onnx.helper.make_node("Add", [x, tag + "_d"], [tag])]
        node.input[ii] = tag
    out = []
    for i, n in enumerate(nodes):
        out += extra.get(i, [])
        out.append(n)
    del p.graph.node[:]
    p.graph.node.extend(out)
    return p.SerializeToString()


def quantization_floor(original: str | bytes, names: list[str], feeds: dict, reference: list,
                       draws: int = FLOOR_DRAWS) -> dict[str, float] | str:
    """Per output, the largest |difference| from ``reference`` (the original's outputs on ``feeds``) when the
    input of every activation quantizer is perturbed by ``ACTIVATION_NOISE`` (see the module doc); a string
    saying why there is none (no activation quantizer, model too large to copy)."""
    import os

    import onnx

    if isinstance(original, str) and os.path.getsize(original) > FLOOR_MAX_BYTES:
        return "the input is too large to copy for the quantization floor"
    proto = onnx.load_from_string(original) if isinstance(original, bytes) else onnx.load(original)
    places = activation_quantizers(proto)
    if not places:
        return "the input quantizes no activations at run time"
    if proto.ByteSize() > FLOOR_MAX_BYTES:
        return "the input is too large to copy for the quantization floor"
    floor = {n: 0.0 for n in names}
    for d in range(draws):
        s = session(_perturbed(proto, places, d), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        for n, a, b in zip(names, reference, s.run(names, feeds)):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a64.shape == b64.shape and a64.size:
                diff = np.abs(a64 - b64)
                floor[n] = max(floor[n], float(np.nanmax(np.where(np.isnan(diff), 0.0, diff))))
        del s
    return floor


def verify(original: str | bytes, fused: str | bytes, *, dims: Mapping[str, int] | None = None,
           default_dim: int = VERIFY_DEFAULT_DIM, seed: int = 0, atol: float | None = None,
           rtol: float | None = None) -> VerifyResult:
    """Both models run with ORT_DISABLE_ALL, so the comparison is of our rewrite alone. An output above
    tolerance of an input that quantizes activations at run time is held against its quantization floor
    (module doc) unless ``atol`` / ``rtol`` are given."""
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s0, s1 = session(original, level), session(fused, level)
    feeds = make_inputs(s0, dims or {}, default_dim, seed)
    names = [o.name for o in s0.get_outputs()]
    r0 = s0.run(names, feeds)
    r1 = s1.run(names, feeds)
    checks = [compare(n, a, b, atol, rtol) for n, a, b in zip(names, r0, r1)]
    result = VerifyResult(all(c.ok for c in checks), checks, {k: list(v.shape) for k, v in feeds.items()}, seed)
    failed = [c for c in checks if not c.ok and c.dtype.startswith(("float", "bfloat")) and c.max_abs_diff < np.inf]
    if failed and atol is None and rtol is None:
        floor = quantization_floor(original, names, feeds, r0)
        if isinstance(floor, str):
            result.floor_note = floor
        else:
            result.floor_note = (f"outputs above tolerance were held against the input's quantization floor: its "
                                 f"activation quantizers' inputs perturbed by {ACTIVATION_NOISE:g} relative, "
                                 f"{FLOOR_DRAWS} draws")
            ref = dict(zip(names, r0))
            for c in failed:
                c.quantization_floor = floor.get(c.name, 0.0)
                a = np.abs(np.asarray(ref[c.name], np.float64))
                slack = c.atol + c.rtol * float(np.nanmax(a)) if a.size else c.atol  # the float tolerance on top
                if c.max_abs_diff <= c.quantization_floor + slack:
                    c.ok = True
                    c.reason = (f"max |diff| {c.max_abs_diff:.3g} above the float tolerance, within the input's "
                                f"quantization floor {c.quantization_floor:.3g} (a rounding step of its quantized "
                                "activations)")
                else:
                    c.reason += f" and above the input's quantization floor {c.quantization_floor:.3g}"
            result.ok = all(c.ok for c in checks)
    return result
