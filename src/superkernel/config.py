"""CompilerConfig: nested, validated-on-assignment settings of the superkernel backend.

Mirrors TorchAir's ``CompilerConfig``: ``config.mode = "reduce-overhead"``,
``config.debug.graph_dump.type = "txt"``, ``config.experimental_config.static_kernel.enable = True``.
Assigning an unknown field or a value outside the allowed set raises at once and
lists what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

#: Graph compile: source fusion by TorchInductor per segment.
MAX_AUTOTUNE = "max-autotune"
#: Graph capture of the unchanged kernels: binary fusion, bit-exact.
REDUCE_OVERHEAD = "reduce-overhead"
#: Every mode, in the order the workflow tries them (the default is MAX_AUTOTUNE).
MODES = (REDUCE_OVERHEAD, MAX_AUTOTUNE)


@dataclass(frozen=True)
class Field:
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    kind: type | tuple[type, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None

    def validate(self, path: str, value: Any) -> Any:
        if self.choices is not None and not any(type(value) is type(c) and value == c for c in self.choices):
            allowed = ", ".join(repr(c) for c in self.choices)
            raise ValueError(f"invalid value {value!r} for {path}; allowed values: {allowed}")
        if self.kind is not None and not isinstance(value, self.kind):
            names = self.kind.__name__ if isinstance(self.kind, type) else " or ".join(k.__name__ for k in self.kind)
            raise TypeError(f"{path} must be {names}, got {type(value).__name__} {value!r}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(f"invalid value {value!r} for {path}: {problem}")
        return value


def _positive_int_list(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return "expected a list of positive integers, e.g. [1, 2, 4]"
    return None


class Section:
    """A group of fields and subsections; assignment is validated."""

    _fields: dict[str, Field] = {}
    _sections: dict[str, type["Section"]] = {}

    def __init__(self, path: str = "config") -> None:
        object.__setattr__(self, "_path", path)
        for name, field in self._fields.items():  # a list default is copied: instances never share one
            object.__setattr__(self, name, list(field.default) if isinstance(field.default, list) else field.default)
        for name, cls in self._sections.items():
            object.__setattr__(self, name, cls(f"{path}.{name}"))

    def __setattr__(self, name: str, value: Any) -> None:
        path = f"{self._path}.{name}"
        if name in self._sections:
            raise AttributeError(f"{path} is a section; set its fields instead ({', '.join(self._sections[name].field_names())})")
        if name not in self._fields:
            raise AttributeError(f"unknown field {path}; allowed: {', '.join(self.field_names())}")
        if isinstance(value, tuple) and isinstance(self._fields[name].default, list):
            value = list(value)
        object.__setattr__(self, name, self._fields[name].validate(path, value))

    @classmethod
    def field_names(cls) -> list[str]:
        return list(cls._fields) + list(cls._sections)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in self._fields}
        for name in self._sections:
            out[name] = getattr(self, name).to_dict()
        return out

    def update(self, values: dict[str, Any]) -> "Section":
        """Set fields from a nested dict (as read from YAML); validated like assignment."""
        if not isinstance(values, dict):
            raise TypeError(f"{self._path} must be a mapping, got {type(values).__name__}")
        for key, value in values.items():
            if not isinstance(key, str):
                raise TypeError(f"{self._path}: keys must be field names (strings), got {type(key).__name__} {key!r}; "
                                f"allowed: {', '.join(self.field_names())}")
            if key in self._sections:
                getattr(self, key).update(value)
            else:
                setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]


class GraphDumpConfig(Section):
    _fields = {
        "type": Field(None, "dump format of captured and segmented graphs", choices=(None, "txt", "py")),
        "path": Field(None, "directory the dumps are written to (default: ./superkernel_graphs)", kind=(str, type(None))),
    }


class DebugConfig(Section):
    _fields = {
        "run_eagerly": Field(False, "run the captured graph operator by operator (the exactness reference)", kind=bool),
    }
    _sections = {"graph_dump": GraphDumpConfig}


def _writable_dir(value: Any) -> str | None:
    if value is None:
        return None
    if not value.strip():
        return "expected a directory path (or None for the running script's directory)"
    path = os.path.expanduser(value)
    if not os.path.isdir(path):
        return "the directory does not exist; create it first"
    if not os.access(path, os.W_OK | os.X_OK):
        return "the directory is not writable by this user"
    return None


class StaticKernelConfig(Section):
    _fields = {
        "enable": Field(False, "record shapes, build kernels ahead of time, and load packages", kind=bool),
        "build_dir": Field(None, "directory of records and packages (default: next to the running script); "
                                 "must exist and be writable", kind=(str, type(None)), check=_writable_dir),
        "batch_sizes": Field([], "batch sizes to build one static variant each for", check=_positive_int_list),
    }


class ExperimentalConfig(Section):
    _fields = {
        "cuda_decode_kernels": Field(False, "CUDA max-autotune: superkernel's own Triton decode kernels for Llama-style "
                                            "layers at batch 1 (runtime/cuda/decode_kernels: six launches a layer), "
                                            "for models prepared with this config (apply_for_generate, or "
                                            "decode_kernels.hookup.install). Not yet measured on hardware "
                                            "(docs/gpu.md, 'Decode kernel set'): on, it warns so",
                                     kind=bool),
    }
    _sections = {"static_kernel": StaticKernelConfig}


class InductorConfig(Section):
    _fields = {
        "cpp_wrapper": Field(True, "CPU max-autotune: give each compiled segment one C++ entry point", kind=bool),
        "autotune": Field(False, "let TorchInductor benchmark kernel/GEMM choices (slow to compile)", kind=bool),
        "freezing": Field("auto", "CPU max-autotune: fold and prepack the weights of inference segments (weights "
                                  "not trained or mutated); 'auto': compile both ways and keep the faster at the "
                                  "real shapes; True: always where allowed; False: never", choices=("auto", True, False)),
        "gemm_templates": Field(True, "CPU max-autotune with frozen weights: let TorchInductor time its C++ GEMM "
                                      "templates against ATen/MKL for every GEMM at its real shape (adds compile time)",
                                kind=bool),
        "gemm_timing": Field("memory", "CPU max-autotune with frozen weights: how TorchInductor times each GEMM's "
                                       "choices; 'memory': every timed call with the weights evicted from the CPU "
                                       "caches, as a decode step reads them; 'cache': Inductor's repeated calls "
                                       "(weights cache-hot)", choices=("memory", "cache")),
        "bf16_gemv": Field("auto", "CPU max-autotune with frozen weights: Inductor's fp32 C++ GEMM micro-kernel loads "
                                   "bf16/fp16 weights whole and prefetches ahead (same results); 'auto': where the "
                                   "CPU has no native bf16 (no avx512_bf16/AMX) and Inductor's ISA is AVX2; True: "
                                   "wherever the ISA is AVX2; False: never", choices=("auto", True, False)),
        "autofusion": Field(False, "CPU max-autotune with frozen weights: run the autofusion planner on each segment's "
                                   "graph before Inductor (horizontal GEMM fusion where measured faster; decisions in "
                                   "explain()); 'on'/True or 'off'/False", choices=(False, True, "off", "on")),
    }


def autofusion_enabled(config: "CompilerConfig") -> bool:
    """Whether ``inductor.autofusion`` is on (True or "on")."""
    return config.inductor.autofusion in (True, "on")


class CpuConfig(Section):
    _fields = {
        "native": Field(True, "CPU reduce-overhead: run each segment's ATen program as one native C++ call (the same "
                              "operators, bit-exact; built once per graph and cached per user); False: the flat "
                              "Python program", kind=bool),
    }


def _positive_int(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) and value > 0 else "expected an int >= 1"


class CudaConfig(Section):
    _fields = {
        "max_captures": Field(8, "CUDA graphs: input signatures (shapes, dtypes, addresses of in-place inputs) captured "
                                 "per part of a step; a call with a further one runs uncaptured (warned once, counted)",
                              check=_positive_int),
        "sync_check": Field(True, "CUDA graphs: listen for host synchronizations during the warm-up call before a "
                                  "capture; a part that synchronizes runs uncaptured instead of failing its capture",
                            kind=bool),
        "pdl": Field(False, "CUDA max-autotune: Triton programmatic dependent launch (each kernel's prologue overlaps "
                            "the previous kernel's tail inside the step's graph; Hopper and newer)", kind=bool),
    }


def _regex_list(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v and "," not in v for v in value):
        return "expected a list of regular expressions over Dynamo source names (no commas), e.g. [\".*\\\\.step_int$\"]"
    for v in value:
        try:
            re.compile(v)
        except re.error as exc:
            return f"{v!r} is not a regular expression: {exc}"
    return None


#: Python ints that grow with every decode step: transformers' sliding-window caches keep the
#: position in ``cumulative_length_int``. Specialized, each new value would recompile.
GROWING_INTS = [r".*\.cumulative_length_int$"]


class DynamoConfig(Section):
    _fields = {
        "dynamic_sources": Field(list(GROWING_INTS), "Python values Dynamo traces as dynamic instead of specializing on "
                                 "them (regular expressions over source names, added to torch.compiler.config."
                                 "dynamic_sources while a superkernel compile traces); the default covers the position "
                                 "int of transformers' sliding-window caches, so a decode loop compiles once; [] adds "
                                 "none", check=_regex_list),
    }


class CompilerConfig(Section):
    """Configuration of the superkernel backend. See docs/api.md for every field."""

    _fields = {
        "mode": Field(
            MAX_AUTOTUNE,
            "max-autotune: source fusion by TorchInductor per segment; reduce-overhead: binary fusion, bit-exact",
            choices=MODES,
        ),
    }
    _sections = {"debug": DebugConfig, "experimental_config": ExperimentalConfig, "inductor": InductorConfig,
                 "cpu": CpuConfig, "dynamo": DynamoConfig, "cuda": CudaConfig}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "CompilerConfig":
        return cls().update(values)  # type: ignore[return-value]

    def fingerprint(self) -> str:
        """Hash of the fields that change generated code (not paths or debug output)."""
        d = self.to_dict()
        relevant = {"mode": d["mode"], "inductor": d["inductor"], "run_eagerly": d["debug"]["run_eagerly"],
                    "cpu": d["cpu"]}
        if d["cuda"]["pdl"]:  # (only when on: fingerprints of earlier configs stay as they were)
            relevant["pdl"] = True
        if d["experimental_config"]["cuda_decode_kernels"]:  # (the same)
            relevant["cuda_decode_kernels"] = True
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]
