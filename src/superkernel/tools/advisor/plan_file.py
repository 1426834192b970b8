"""``superkernel.yaml``: the recommended scopes and mode, and ``superkernel.apply`` to use them.

Format (version 1)::

    version: 1
    model: llama-tiny            # what it was measured on (informational)
    strategy: attention          # informational
    mode: reduce-overhead        # CompilerConfig.mode
    options: ""                  # scope options, e.g. "stream-fusion=1"
    scopes:                      # label -> module glob or list of globs
      attention: [model.layers.*.self_attn]
    measured: {...}              # numbers from the run that chose it (informational)
    inductor: {freezing: true}   # optional: CompilerConfig.inductor fields the measuring run chose
                                 # (CPU max-autotune: frozen weights measured faster), applied by apply()
    quantization: {scheme: w8a8} # optional: the model was quantized (superkernel.runtime.quant_schemes.SCHEMES,
                                 # int4-weight / w4a8 also group_size; head: the output head's scheme where
                                 # it is not the row's default); apply(), apply_for_generate() and bench
                                 # quantize a float model the same way first

When no superkernel plan beat plain torch.compile beyond noise, ``optimize`` writes the
plan ``backend: torch.compile`` with empty ``scopes`` (and no mode): ``superkernel.apply``
then removes any scopes and returns ``torch.compile(model)`` (default TorchInductor). When
``torch.compile(mode="reduce-overhead")`` (measured on CUDA) beat the plan that would be
recommended, beyond noise, the plan is ``backend: torch.compile`` with ``mode: reduce-overhead``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from superkernel.util import InputFileError, atomic_write, read_limited, safe_text, short_repr
from superkernel.config import MODES

VERSION = 1
_KEYS = {"version", "model", "strategy", "mode", "options", "scopes", "measured", "backend", "inductor", "quantization"}
SUPERKERNEL, TORCH_COMPILE = "superkernel", "torch.compile"
BACKENDS = (SUPERKERNEL, TORCH_COMPILE)
#: what a ``backend: torch.compile`` plan's mode may be: plain torch.compile, or its CUDA-graph mode (the peer
#: optimize measures on CUDA)
TORCH_COMPILE_MODES = (None, "reduce-overhead")


class PlanFileError(ValueError):
    """A superkernel.yaml that cannot be read or is malformed."""


@dataclass
class PlanFile:
    scopes: dict[str, list[str]]
    mode: str
    options: str = ""
    model: str | None = None
    strategy: str | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    backend: str = SUPERKERNEL
    inductor: dict[str, Any] = field(default_factory=dict)  # CompilerConfig.inductor fields (see the format)
    quantization: dict[str, Any] = field(default_factory=dict)  # {"scheme": ..., "group_size": ...}; {}: float

    def to_dict(self) -> dict[str, Any]:
        out = {"version": VERSION, "model": self.model, "strategy": self.strategy, "mode": self.mode,
               "options": self.options, "scopes": self.scopes, "measured": self.measured}
        if self.inductor:
            out["inductor"] = dict(self.inductor)
        if self.quantization:
            out["quantization"] = dict(self.quantization)
        if self.backend != SUPERKERNEL:
            out = {"version": VERSION, "backend": self.backend, **{k: v for k, v in out.items() if k != "version"}}
        return out


def _validate(data: Any, where: str) -> PlanFile:
    if not isinstance(data, Mapping):
        raise PlanFileError(f"{where}: expected a mapping with 'scopes' and 'mode', got {type(data).__name__}")
    unknown = set(data) - _KEYS
    if unknown:
        raise PlanFileError(f"{where}: unknown key(s) {safe_text(', '.join(sorted(map(str, unknown))), 200)}; allowed: {', '.join(sorted(_KEYS))}")
    if data.get("version", VERSION) != VERSION:
        raise PlanFileError(f"{where}: version {short_repr(data.get('version'))} is not supported (this superkernel reads {VERSION})")
    backend = data.get("backend", SUPERKERNEL)
    if backend not in BACKENDS:
        raise PlanFileError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {short_repr(backend)}")
    quantization = _quantization(data.get("quantization"), where)
    if backend == TORCH_COMPILE:
        if data.get("scopes"):
            raise PlanFileError(f"{where}: a 'backend: torch.compile' plan has no scopes (got {short_repr(data.get('scopes'))})")
        model, strategy = data.get("model"), data.get("strategy")
        if (model is not None and not isinstance(model, str)) or (strategy is not None and not isinstance(strategy, str)):
            raise PlanFileError(f"{where}: 'model' and 'strategy' must be strings")
        mode = data.get("mode")
        if mode not in TORCH_COMPILE_MODES:
            raise PlanFileError(f"{where}: a 'backend: torch.compile' plan's mode is reduce-overhead or none (plain "
                                f"torch.compile), got {short_repr(mode)}")
        measured = data.get("measured") or {}
        return PlanFile(scopes={}, mode=mode, model=model, strategy=strategy, backend=TORCH_COMPILE,
                        measured=dict(measured) if isinstance(measured, Mapping) else {}, quantization=quantization)
    mode = data.get("mode")
    if mode not in MODES:
        raise PlanFileError(f"{where}: mode must be one of {', '.join(MODES)}, got {short_repr(mode)}")
    scopes = data.get("scopes")
    if not isinstance(scopes, Mapping) or not scopes:
        raise PlanFileError(f"{where}: 'scopes' must be a non-empty mapping of label -> module glob(s)")
    norm: dict[str, list[str]] = {}
    for label, globs in scopes.items():
        items = [globs] if isinstance(globs, str) else globs
        if not isinstance(label, str) or not label or not isinstance(items, list) or not items \
                or not all(isinstance(g, str) and g for g in items):
            raise PlanFileError(f"{where}: scope {short_repr(label)} must map to a module glob or a list of globs, got {short_repr(globs)}")
        norm[label] = list(items)
    options = data.get("options") or ""
    if not isinstance(options, str):
        raise PlanFileError(f"{where}: 'options' must be a string like 'stream-fusion=1', got {short_repr(options)}")
    from superkernel.scope import parse_options

    try:
        parse_options(options)
    except ValueError as exc:
        raise PlanFileError(f"{where}: {safe_text(exc, 300)}") from None
    measured = data.get("measured") or {}
    for key in ("model", "strategy"):
        if data.get(key) is not None and not isinstance(data.get(key), str):
            raise PlanFileError(f"{where}: {short_repr(key)} must be a string, got {short_repr(data.get(key))}")
    inductor = data.get("inductor") or {}
    if not isinstance(inductor, Mapping):
        raise PlanFileError(f"{where}: 'inductor' must be a mapping of CompilerConfig.inductor fields, got {short_repr(inductor)}")
    from superkernel.config import CompilerConfig

    try:
        CompilerConfig().inductor.update(dict(inductor))
    except (AttributeError, TypeError, ValueError) as exc:
        raise PlanFileError(f"{where}: inductor: {safe_text(exc, 300)}") from None
    return PlanFile(scopes=norm, mode=mode, options=options, model=data.get("model"), strategy=data.get("strategy"),
                    measured=dict(measured) if isinstance(measured, Mapping) else {}, inductor=dict(inductor),
                    quantization=quantization)


def _quantization(value: Any, where: str) -> dict[str, Any]:
    """The plan's ``quantization`` entry, checked (a mapping with ``scheme`` and, for int4-weight, ``group_size``;
    without one it is chosen for the model when quantizing)."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, Mapping) or set(value) - {"scheme", "group_size", "head"} or "scheme" not in value:
        raise PlanFileError(f"{where}: 'quantization' must be a mapping with 'scheme' (and optionally 'group_size' "
                            f"for int4-weight / w4a8, 'head' for the output head's scheme), got {short_repr(value)}")
    from superkernel.tools.quantize import QuantizationError, check_head, check_scheme

    try:
        scheme, group = check_scheme(value["scheme"], value.get("group_size"))
        if "head" in value:
            check_head(scheme, value["head"])
    except QuantizationError as exc:
        raise PlanFileError(f"{where}: quantization: {safe_text(exc, 300)}") from None
    return {"scheme": scheme, **({"group_size": group} if group is not None else {}),
            **({"head": value["head"]} if "head" in value else {})}


def quantize_for_plan(model: Any, spec: "PlanFile") -> dict[str, Any] | None:
    """Quantize a float ``model`` as ``spec`` says (None when the plan is float or the model is quantized already,
    which is taken as the user's own quantization)."""
    if not spec.quantization:
        return None
    from superkernel.tools.quantize import is_quantized, quantize_model

    if is_quantized(model):
        return None
    return quantize_model(model, spec.quantization["scheme"], group_size=spec.quantization.get("group_size"),
                          head=spec.quantization.get("head")).to_dict()


def inductor_choices(explanation: Any) -> dict[str, Any]:
    """The CompilerConfig.inductor settings a measuring run chose, for :attr:`PlanFile.inductor`.

    CPU max-autotune times every partition plain and with frozen weights
    (``inductor.freezing = "auto"``); a plan records the outcome so ``apply`` compiles the
    chosen way without timing again: ``{"freezing": True}`` when any segment was frozen,
    ``{"freezing": False}`` when CPU max-autotune segments were compiled and none was.
    """
    segments = [s for g in explanation.graphs if g.mode == "max-autotune" and g.device == "cpu" for s in g.segments]
    if any(s.realization.endswith("+frozen") for s in segments):
        return {"freezing": True}
    if any(s.realization.startswith("inductor-") for s in segments):
        return {"freezing": False}
    return {}


def read_plan(source: str | Path | Mapping[str, Any]) -> PlanFile:
    """Read and validate a plan from a YAML path or an already-loaded dict."""
    if not isinstance(source, (str, Path)):
        return _validate(source, "plan")
    path = Path(source)
    try:
        text = read_limited(path, MAX_PLAN_BYTES, "plan file").decode("utf-8")
    except InputFileError as exc:
        raise PlanFileError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise PlanFileError(f"cannot read plan file {safe_text(path)}: {exc}") from None
    try:
        check_yaml_limits(text)
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise PlanFileError(f"{safe_text(path)}: not valid YAML: {safe_text(' '.join(str(exc).split()), 300)}") from None
    return _validate(data, safe_text(path))


MAX_PLAN_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000  # after alias expansion


def check_yaml_limits(text: str) -> None:
    """Refuse YAML whose nesting or expanded size (aliases counted each time they are used) is beyond the
    limits, from the event stream alone: nothing is built, and no parser recursion runs before this."""
    stack: list[list[int]] = []  # per open collection: [expanded nodes, deepest nesting below]
    anchors: dict[str, tuple[int, int]] = {}
    open_anchors: list[str | None] = []
    total = 0

    def add(nodes: int, depth: int) -> None:
        nonlocal total
        total += nodes if not stack else 0
        if stack:
            stack[-1][0] += nodes
            stack[-1][1] = max(stack[-1][1], depth)
        if total > MAX_YAML_NODES or (stack and stack[-1][0] > MAX_YAML_NODES):
            raise ValueError(f"more than {MAX_YAML_NODES} values once aliases are expanded")

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_YAML_DEPTH:
                raise ValueError(f"nested deeper than {MAX_YAML_DEPTH} levels")
            stack.append([1, 0])
            open_anchors.append(event.anchor)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            nodes, below = stack.pop()
            anchor = open_anchors.pop()
            if anchor:
                anchors[anchor] = (nodes, below + 1)
            add(nodes, below + 1)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor:
                anchors[event.anchor] = (1, 0)
            add(1, 0)
        elif isinstance(event, yaml.AliasEvent):
            nodes, depth = anchors.get(event.anchor, (1, 0))
            if len(stack) + depth > MAX_YAML_DEPTH:
                raise ValueError(f"nested deeper than {MAX_YAML_DEPTH} levels once aliases are expanded")
            add(nodes, depth)


def write_plan(path: str | Path, plan: PlanFile, inputs: list[Path] = ()) -> Path:
    header = (f"# superkernel plan, written by `superkernel optimize` on {_dt.date.today().isoformat()}.\n"
              "# Use it: model = superkernel.apply(model, \"superkernel.yaml\")   (returns the compiled model)\n"
              "# Re-measure: superkernel bench --config superkernel.yaml\n")
    body = yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=False, width=100)
    return atomic_write(Path(path), header + body, inputs)


def apply(model: Any, plan: str | Path | Mapping[str, Any], *, mode: str | None = None) -> Any:
    """Put the plan's scopes on ``model`` and return it compiled with the superkernel backend.

    The scopes are applied in place (earlier ones are removed first); the return value
    is ``superkernel.compile(model, cfg)`` with ``cfg.mode`` from the plan (or ``mode``).
    Use the returned module for decode steps with a static KV cache; run prefill with
    the original ``model`` (scopes do nothing outside torch.compile).
    """
    import superkernel

    spec = read_plan(plan)
    quantize_for_plan(model, spec)
    if spec.backend == TORCH_COMPILE:  # optimize found no superkernel plan faster than this
        import torch

        superkernel.remove_scopes(model)
        return torch.compile(model, mode=spec.mode)
    cfg = superkernel.CompilerConfig()
    cfg.mode = mode or spec.mode
    cfg.inductor.update(spec.inductor)
    superkernel.remove_scopes(model)
    superkernel.apply_scopes(model, spec.scopes, options=spec.options)
    return superkernel.compile(model, cfg)
