"""Verification: run the original and the fused model in ONNX Runtime on the same seeded
random inputs and compare every output with a per-dtype tolerance."""

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


@dataclass
class VerifyResult:
    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    inputs: dict[str, list[int]] = field(default_factory=dict)
    seed: int = 0

    @property
    def failed(self) -> list[OutputCheck]:
        return [o for o in self.outputs if not o.ok]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seed": self.seed, "inputs": self.inputs,
                "outputs": [asdict(o) for o in self.outputs]}


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


def verify(original: str | bytes, fused: str | bytes, *, dims: Mapping[str, int] | None = None,
           default_dim: int = VERIFY_DEFAULT_DIM, seed: int = 0, atol: float | None = None,
           rtol: float | None = None) -> VerifyResult:
    """Both models run with ORT_DISABLE_ALL, so the comparison is of our rewrite alone."""
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s0, s1 = session(original, level), session(fused, level)
    feeds = make_inputs(s0, dims or {}, default_dim, seed)
    names = [o.name for o in s0.get_outputs()]
    r0 = s0.run(names, feeds)
    r1 = s1.run(names, feeds)
    checks = [compare(n, a, b, atol, rtol) for n, a, b in zip(names, r0, r1)]
    return VerifyResult(all(c.ok for c in checks), checks, {k: list(v.shape) for k, v in feeds.items()}, seed)
