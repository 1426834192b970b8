"""Time a pair of large models on transparent huge pages, in a child process.

On 4 KiB pages a session of a ~1 GB model (a real-width decode step) keeps a speed of its own
for its whole life: four sessions of one Qwen2-0.5B-wide decode model in one process ran
52-61 ms, reproducibly (benchmarks/results/onnx_real_width_decode.md). The end-to-end check
cannot resolve 1 % through that. glibc's ``glibc.malloc.hugetlb=1`` tunable (glibc >= 2.35)
madvises malloc's large blocks for transparent huge pages, and then the sessions ran within
noise of each other. A tunable is read when a process starts, so when this process's memory
is not on huge pages and the models are large, :func:`pair_sampler` times them in a child
process started with it: the same :class:`superkernel.onnx.timing.PairSampler`, driven over
a pipe (``sample(n)`` sends ``n``, the child answers one JSON line of ``n`` pairs).

The child runs this module (``python -m superkernel.onnx.hugepages``) on model files the
parent names and inputs the parent wrote (``numpy.savez``, read back without pickle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

from ..hugepages import TUNABLE, glibc_supports_tunable, transparent_huge_pages_usable, tunable_set, with_tunable

__all__ = ["TUNABLE", "glibc_supports_tunable", "transparent_huge_pages_usable", "tunable_set", "pair_sampler",
           "ChildPairSampler", "should_use_child", "child_env", "model_bytes"]

LARGE_MODEL_BYTES = 256 << 20  # a session of a model this large streams enough pages to matter


def model_bytes(path: str) -> int:
    """Size of an ONNX model file plus its external data files in the same folder (a bound)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    folder, base = os.path.split(os.path.abspath(path))
    for name in os.listdir(folder or "."):
        if name.startswith(base) and name != base:  # model.onnx.data and the like
            try:
                size += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass
    return size


def should_use_child(a: str, b: str) -> bool:
    """Time in a huge-page child when the models are large, this process is not already set up
    for huge pages, and the platform supports it."""
    return (isinstance(a, str) and isinstance(b, str) and not tunable_set()
            and max(model_bytes(a), model_bytes(b)) >= LARGE_MODEL_BYTES
            and glibc_supports_tunable() and transparent_huge_pages_usable())


def child_env() -> dict:
    """This environment plus the tunable, with this superkernel first on the import path."""
    import superkernel

    env = with_tunable(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(superkernel.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (src, env.get("PYTHONPATH", "")) if x)
    return env


class ChildPairSampler:
    """:class:`superkernel.onnx.timing.PairSampler` of model files ``a`` and ``b`` in a child
    process on huge pages. Same interface: ``order``, ``seconds``, ``sample(n)``; ``child``
    says what the child saw (its GLIBC_TUNABLES and anonymous huge-page kB)."""

    def __init__(self, a: str, b: str, feeds: dict, *, threads: int = 1, warmup: int = 5, seed: int | None = None,
                 timeout: float = 900.0):
        import numpy as np

        self._tmp = tempfile.TemporaryDirectory(prefix="superkernel-pair-")
        inputs = os.path.join(self._tmp.name, "feeds.npz")
        np.savez(inputs, **{f"i{k}": np.asarray(v) for k, v in enumerate(feeds.values())})
        spec = {"a": a, "b": b, "inputs": inputs, "names": list(feeds), "threads": threads, "warmup": warmup,
                "seed": seed}
        self._timeout = timeout
        self._proc = subprocess.Popen([sys.executable, "-m", "superkernel.onnx.hugepages", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        hello = self._read()
        self.order, self.child = hello["order"], hello["child"]
        self.seconds = 0.0

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(timeout=self._timeout)
            raise RuntimeError(f"the huge-page timing process ended (exit {code}) without an answer")
        return json.loads(line)

    def sample(self, rounds: int) -> list[tuple[float, float]]:
        self._proc.stdin.write(f"{int(rounds)}\n")
        self._proc.stdin.flush()
        got = self._read()
        self.seconds = got["seconds"]
        return [tuple(p) for p in got["pairs"]]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._tmp.cleanup()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def pair_sampler(threads: int = 1, warmup: int = 5) -> Callable:
    """``sampler(a, b, feeds, seed)`` for the end-to-end check: a :class:`ChildPairSampler`
    when :func:`should_use_child` says so, else an in-process :class:`timing.PairSampler`."""
    from . import timing as T

    def make(a, b, feeds: dict, seed: int):
        if should_use_child(a, b):
            return ChildPairSampler(a, b, feeds, threads=threads, warmup=warmup, seed=seed)
        return T.PairSampler(a, b, feeds, threads=threads, warmup=warmup, seed=seed)
    return make


def _child(spec_json: str) -> int:
    import numpy as np

    from . import timing as T

    spec = json.loads(spec_json)
    with np.load(spec["inputs"], allow_pickle=False) as z:
        feeds = {name: z[f"i{k}"] for k, name in enumerate(spec["names"])}
    sampler = T.PairSampler(spec["a"], spec["b"], feeds, threads=spec["threads"], warmup=spec["warmup"],
                            seed=spec["seed"])
    out = sys.stdout
    import superkernel

    seen = {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "anon_huge_pages_kb": T.anon_huge_pages_kb(),
            "superkernel": os.path.abspath(superkernel.__file__)}
    out.write(json.dumps({"order": sampler.order, "child": seen}) + "\n")
    out.flush()
    for line in sys.stdin:
        n = int(line)
        if n <= 0:
            break
        pairs = sampler.sample(n)
        out.write(json.dumps({"pairs": pairs, "seconds": sampler.seconds}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
