"""Calibration: measure each candidate fusion on this machine before keeping it.

For a candidate, two micro-models are built at the model's shapes: the matched subgraph
as it is (*unfused*) and its replacement (*fused*), with the same inputs (random data)
and outputs. Both run in ONNX Runtime with ``ORT_ENABLE_ALL`` (so the unfused side gets
whatever ONNX Runtime would fuse by itself), interleaved, and the medians are compared.
A fusion is kept only when its fused micro-model is faster.

Measurements are cached per (structure of both micro-models with shapes and dtypes,
CPU, ONNX Runtime version, threads) in a JSON file under the user cache directory
(``$SUPERKERNEL_CACHE_DIR`` or ``$XDG_CACHE_HOME/superkernel`` or ``~/.cache/superkernel``),
so the layers of a model that share shapes are measured once and later runs reuse it.

``Calibrator(measure=...)`` is the seam for tests: ``measure(unfused, fused)`` returns
the two median times in microseconds (and optionally a dict of spread figures). The real
timing warms the process with a throw-away session and creates two sessions per side,
ABBA or BAAB (:class:`superkernel.onnx.timing.PairSampler`); the spread kept is the paired ratio
fused/unfused with its 95 % interval.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from . import _util as U
from superkernel.util import cpu_id, exception_summary

CACHE_VERSION = 3  # 2: warmed process, random session order, spread kept; 3: ABBA sessions
SPREAD_KEYS = ("ratio", "ratio_lo", "ratio_hi", "rounds", "created_first")
MICRO_WARMUP = 5
MICRO_ROUNDS = 40
MAX_MICRO_BYTES = 256 << 20  # do not materialize micro-models above this (the estimate decides)


@dataclass
class Measurement:
    unfused_us: float
    fused_us: float
    cached: bool = False
    spread: dict = field(default_factory=dict)  # paired ratio fused/unfused with its interval, rounds

    @property
    def saved_us(self) -> float:
        return self.unfused_us - self.fused_us

    @property
    def faster(self) -> bool:
        return self.fused_us < self.unfused_us

    def to_dict(self) -> dict:
        return {"unfused_us": self.unfused_us, "fused_us": self.fused_us, "saved_us": self.saved_us,
                "faster": self.faster, "cached": self.cached, **self.spread}


def cache_dir() -> str:
    """The user's private superkernel cache (:func:`superkernel.cache_dir.private_cache_dir`). When it cannot be
    used safely (another user owns it, others can write it), a private directory for this process only, with
    a warning: measurements are then not kept between runs."""
    from superkernel.cache_dir import CacheDirError, private_cache_dir

    try:
        return str(private_cache_dir())
    except CacheDirError as exc:
        global _PROCESS_CACHE
        if _PROCESS_CACHE is None:
            import tempfile
            import warnings

            _PROCESS_CACHE = tempfile.mkdtemp(prefix="superkernel-calibration-")
            warnings.warn(f"superkernel: {exc}; calibration results are kept for this process only", stacklevel=2)
        return _PROCESS_CACHE


_PROCESS_CACHE: str | None = None

CACHE_MAX_BYTES = 64 << 20
CACHE_MAX_DEPTH = 8
_RECORD_DOMAIN = b"superkernel-onnx-calibration/1"


def _entries_bytes(entries: Mapping[str, dict]) -> bytes:
    return json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()


def read_cache(path: str) -> tuple[dict[str, dict], str | None]:
    """The measurements of the cache file ``path`` and None, or ``{}`` and why they are not used: the file
    must be a regular file of this user, small and shallow, and its entries signed with this user's key
    (a file anyone else wrote, or changed, is ignored: measurements decide which fusions are kept)."""
    from superkernel.cache_dir import owned_file
    from superkernel.userkey import signed_by_me
    from superkernel.util import InputFileError, json_depth, read_limited

    if owned_file(path) is None:
        return {}, "ignored: not a regular file of this user that only this user can write"
    try:
        raw = read_limited(path, CACHE_MAX_BYTES, "calibration cache")
        json_depth(raw, CACHE_MAX_DEPTH)
        data = json.loads(raw)
    except (InputFileError, OSError, ValueError) as exc:
        return {}, f"ignored: {exception_summary(exc)}"
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not signed_by_me(_RECORD_DOMAIN, _entries_bytes(entries), data.get("signature")):
        return {}, "ignored: not signed with this user's key (written by someone else, or changed)"
    return {k: v for k, v in entries.items() if isinstance(v, dict)}, None


def write_cache(path: str, entries: Mapping[str, dict], inputs: Sequence[str] = ()) -> None:
    """Write ``entries`` signed with this user's key, atomically, through the one output check
    (never one of ``inputs``, never through a link)."""
    from superkernel.userkey import mac
    from superkernel.util import atomic_write

    signature = mac(_RECORD_DOMAIN, _entries_bytes(entries))
    text = json.dumps({"version": CACHE_VERSION, "entries": entries, "signature": signature}, indent=0,
                      sort_keys=True)
    atomic_write(path, text, inputs)


class Calibrator:
    """Builds, times and caches micro-benchmarks of candidate fusions."""

    def __init__(self, *, threads: int = 1, cache_path: str | None = None, use_cache: bool = True,
                 measure: Callable[[bytes, bytes], tuple[float, float]] | None = None,
                 dims: Mapping[str, int] | None = None, default_dim: int = 1, inputs: Sequence[str] = ()):
        import onnxruntime as ort

        self.threads = threads
        self.dims, self.default_dim = dict(dims or {}), default_dim
        self.use_cache = use_cache and measure is None
        self.cache_path = cache_path or os.path.join(cache_dir(), "onnx_calibration.json")
        self.inputs = list(inputs)  # files of the run the cache may never replace
        self._measure = measure or self._time_pair
        self.env = f"{cpu_id()}|ort {ort.__version__}|threads {threads}|v{CACHE_VERSION}"
        self._cache: dict[str, dict] | None = None
        self.measured = 0
        self.reused = 0
        self.cache_note: str | None = None  # why the cache file was not used, when it was not

    # ---- cache ------------------------------------------------------------------------
    def _load(self) -> dict[str, dict]:
        if self._cache is None:
            self._cache = {}
            if self.use_cache and os.path.lexists(self.cache_path):
                self._cache, self.cache_note = read_cache(self.cache_path)
        return self._cache

    def save(self) -> None:
        if not self.use_cache or self._cache is None:
            return
        try:
            write_cache(self.cache_path, self._cache, self.inputs)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written only costs time
            self.cache_note = f"not written: {exception_summary(exc)}"

    # ---- micro-models -----------------------------------------------------------------
    def micro_models(self, match_nodes, outputs, new_nodes, new_outputs, opsets) -> tuple[bytes, bytes, str] | str:
        """(unfused bytes, fused bytes, cache key), or a reason string when not measurable."""
        for n in new_nodes:  # detached replacement nodes: name their values so they serialize
            for v in n.outputs:
                if not v.name:
                    v.name = f"_sk_micro_{id(v)}"
        try:
            names: dict[int, str] = {}
            a = _micro(list(match_nodes), outputs, opsets, self.dims, self.default_dim, names)
            if isinstance(a, str):
                return a
            b = _micro(list(new_nodes), new_outputs, opsets, self.dims, self.default_dim, names, like=a[1],
                       out_dtypes=[v.dtype for v in outputs])
            if isinstance(b, str):
                return b
        except Exception as e:  # noqa: BLE001
            return f"micro-model not built ({exception_summary(e, 500, first_line=False)})"
        key = hashlib.sha256((self.env + "|" + a[2] + "|" + b[2]).encode()).hexdigest()[:32]
        return a[0], b[0], key

    def calibrate(self, unfused: bytes, fused: bytes, key: str) -> Measurement:
        cache = self._load()
        hit = cache.get(key)
        if hit and "unfused_us" in hit and "fused_us" in hit:
            self.reused += 1
            return Measurement(float(hit["unfused_us"]), float(hit["fused_us"]), cached=True,
                               spread={k: hit[k] for k in SPREAD_KEYS if k in hit})
        got = self._measure(unfused, fused)
        u, f = got[0], got[1]
        extra = dict(got[2]) if len(got) > 2 else {}
        self.measured += 1
        cache[key] = {"unfused_us": u, "fused_us": f, **extra, "env": self.env, "time": int(time.time())}
        return Measurement(u, f, spread=extra)

    def _time_pair(self, unfused: bytes, fused: bytes) -> tuple[float, float, dict]:
        """Medians in us, and the spread (the paired ratio fused/unfused with its interval,
        the session creation order). Warmed process, two sessions per side created ABBA/BAAB
        (:class:`superkernel.onnx.timing.PairSampler`)."""
        import onnxruntime as ort

        from . import timing as T
        from .verify import session

        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        probe = [session(unfused, level, self.threads), session(fused, level, self.threads)]  # input metadata only
        feeds = {**random_feeds(probe[1]), **random_feeds(probe[0])}
        per = [{i.name: feeds[i.name] for i in s.get_inputs()} for s in probe]
        del probe
        sampler = T.PairSampler(unfused, fused, per[0], threads=self.threads, warmup=MICRO_WARMUP, seed=self.measured,
                                feeds_b=per[1])
        pairs = sampler.sample(MICRO_ROUNDS)
        est = T.ratio_estimate(pairs)
        return statistics.median(u for u, _ in pairs) * 1e3, statistics.median(f for _, f in pairs) * 1e3, {
            "ratio": est.ratio, "ratio_lo": est.lo, "ratio_hi": est.hi, "rounds": est.rounds,
            "created_first": "fused" if sampler.order[0] == 1 else "unfused"}


_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
       "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8,
       "tensor(int8)": np.int8}


def random_feeds(sess) -> dict:
    """Float inputs ~ N(0, 1); integer inputs 0 (valid as indices and positions); bool True."""
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        dt = _NP.get(i.type, np.float32)
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif dt is np.bool_:
            feeds[i.name] = np.ones(shape, dtype=bool)
        else:
            feeds[i.name] = np.zeros(shape, dtype=dt)
    return feeds


def _micro(nodes, outputs, opsets, dims, default_dim, names: dict[int, str], like: list[str] | None = None,
           out_dtypes=None):
    """A standalone model of ``nodes``: values produced outside become inputs (constants
    become initializers), ``outputs`` become outputs. Returns (bytes, input names in
    order, structural signature) or a reason."""
    nodes = _with_producers(nodes)
    produced = {v for n in nodes for v in n.outputs}

    def name(v: ir.Value) -> str:
        if id(v) not in names:
            names[id(v)] = f"v{len(names)}"
        return names[id(v)]

    graph_inputs, inits, sig = [], [], []
    seen: set[int] = set()
    total = 0
    for n in nodes:
        for v in n.inputs:
            if v is None or v in produced or id(v) in seen:
                continue
            seen.add(id(v))
            arr = U.const_array(v)
            if arr is not None:
                total += arr.nbytes
                if total > MAX_MICRO_BYTES:
                    return "constants too large for a micro-benchmark"
                inits.append(onnx.numpy_helper.from_array(np.asarray(arr), name(v)))
                sig.append(f"const {name(v)} {arr.dtype} {list(arr.shape)}"
                           + (f" {arr.reshape(-1).tolist()}" if arr.size <= 16 else ""))
                continue
            shape, _ = U.concrete_shape(v, dims, default_dim)
            if v.dtype is None or shape is None:
                return f"input {v.name} has no known dtype/shape"
            graph_inputs.append((v, shape))
    if like is not None:  # same inputs in the same order as the unfused micro-model
        order = {n_: i for i, n_ in enumerate(like)}
        graph_inputs.sort(key=lambda it: order.get(_orig_name(it[0]), len(order)))
    in_protos = []
    for v, shape in graph_inputs:
        in_protos.append(onnx.helper.make_tensor_value_info(name(v), int(v.dtype), list(shape)))
        sig.append(f"in {name(v)} {v.dtype} {list(shape)}")
    node_protos = []
    for n in nodes:
        p = ir.serde.serialize_node(n)
        del p.input[:]
        p.input.extend(name(v) if v is not None else "" for v in n.inputs)
        del p.output[:]
        p.output.extend(name(v) if (v.uses() or v in outputs) else "" for v in n.outputs)
        p.name = ""
        p.doc_string = ""
        del p.metadata_props[:]
        node_protos.append(p)
        sig.append(onnx.helper.printable_node(p))
    out_protos = []
    for i, v in enumerate(outputs):
        dt = v.dtype if v.dtype is not None else (out_dtypes[i] if out_dtypes and i < len(out_dtypes) else None)
        if dt is None:
            return f"output {v.name} has no known dtype"
        out_protos.append(onnx.helper.make_tensor_value_info(name(v), int(dt), None))
    for v in outputs:
        sig.append(f"out {name(v)}")
    g = onnx.helper.make_graph(node_protos, "micro", in_protos, out_protos, initializer=inits)
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    m.ir_version = 10
    blob = m.SerializeToString()
    return blob, [_orig_name(v) for v, _ in graph_inputs], "\n".join(sig)


MAX_PULLED = 16


def _with_producers(nodes: list) -> list:
    """``nodes`` preceded by the graph nodes computing those of their inputs whose dtype or
    shape is not annotated (helper values an earlier fusion added after shape inference, e.g.
    a rotary cos/sin cache), recursively up to ``MAX_PULLED`` nodes: both micro-models then
    compute them the same way from values of known shape."""
    produced = {v for n in nodes for v in n.outputs}
    pulled: list = []
    frontier = [v for n in nodes for v in n.inputs if v is not None and v not in produced]
    while frontier:
        v = frontier.pop()
        if v in produced or U.const_array(v) is not None or (v.dtype is not None and v.shape is not None):
            continue
        p = v.producer()
        if p is None or p.graph is None or len(pulled) >= MAX_PULLED:
            continue
        pulled.append(p)
        produced.update(p.outputs)
        frontier.extend(x for x in p.inputs if x is not None and x not in produced)
    if not pulled:
        return nodes
    order = {n: i for i, n in enumerate(pulled[0].graph)}
    return sorted(pulled, key=lambda n: order.get(n, -1)) + list(nodes)


def _orig_name(v: ir.Value) -> str:
    return f"{id(v)}"
