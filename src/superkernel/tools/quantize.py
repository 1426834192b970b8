"""Quantized models: one call quantizes a loaded model's linear layers with torchao (``superkernel[quant]``).

    from superkernel.tools.quantize import quantize_model
    info = quantize_model(model, "w8a8")      # or "int8-weight", "int4-weight"

The quantization itself is torchao's (``quantize_`` with its configs); superkernel's part is what comes after:
scopes, both modes, static packages, ``generate()`` and the workflow on the quantized model, and reports that
show what quantization costs beside what fusion gains (DESIGN.md §5a). torchao's own global Inductor settings
(``set_inductor_config``) are never applied: they would change every later compile in the process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from superkernel.runtime.quant_schemes import SCHEMES, Scheme, grouped_names


class QuantizationError(ValueError):
    """A quantization that cannot be applied (unknown scheme, not on this device, nothing to quantize)."""


@dataclass
class Quantization:
    """What :func:`quantize_model` did, for reports and plan files."""

    scheme: str
    group_size: int | None = None
    group_choice: str = ""                              # "given", or how it was chosen for the model's widths
    layers: int = 0                                     # linear layers quantized
    skipped: list[str] = field(default_factory=list)    # "name: why" of linear layers left in float
    head: str = ""                                      # "lm_head: int8-weight": the output head's own scheme
    weight_bytes_before: int = 0                        # parameters in bytes, before and after
    weight_bytes_after: int = 0
    library: str = ""                                   # "torchao 0.18.0"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def plan_entry(self) -> dict[str, Any]:
        """What a plan file records to reproduce it."""
        entry: dict[str, Any] = {"scheme": self.scheme}
        if self.group_size is not None:
            entry["group_size"] = self.group_size
        head = self.head.rpartition(": ")[2]
        if head and head != check_head(self.scheme, None):
            entry["head"] = head
        return entry


def check_scheme(scheme: Any, group_size: Any = None) -> tuple[str, int | None]:
    """``(scheme, group_size)`` validated (group_size None: a grouped scheme chooses one for the model); a
    :class:`QuantizationError` naming what is allowed otherwise."""
    if scheme not in SCHEMES:
        raise QuantizationError(f"unknown quantization {scheme!r}; allowed: {', '.join(SCHEMES)}")
    row = SCHEMES[scheme]
    if not row.grouped:
        if group_size is not None:
            raise QuantizationError(f"group_size applies to {' and '.join(grouped_names())} only, not to {scheme}")
        return scheme, None
    if group_size is not None and group_size not in row.group_sizes:
        raise QuantizationError(f"{scheme} group_size {group_size!r} is not supported; allowed: "
                                f"{', '.join(map(str, row.group_sizes))}")
    return scheme, group_size


#: ``quantize_model(head=...)``: besides a scheme name, the head may stay float
HEAD_FLOAT = "float"


def check_head(scheme: str, head: Any) -> str:
    """The output head's scheme for ``scheme`` (``head`` None: the row's choice, or the scheme itself); a
    :class:`QuantizationError` naming what is allowed otherwise."""
    if head is None:
        return SCHEMES[scheme].head or scheme
    allowed = [scheme, *(name for name, row in SCHEMES.items() if not row.grouped and name != scheme), HEAD_FLOAT]
    if head not in allowed:
        raise QuantizationError(f"head quantization {head!r} is not allowed with {scheme}; allowed: "
                                f"{', '.join(allowed)} (a grouped scheme only as the model's own)")
    return head


def output_head(model: torch.nn.Module) -> str | None:
    """The name of ``model``'s output head (``get_output_embeddings()``, a linear layer), or None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear):
        return None
    return next((name for name, module in model.named_modules() if module is head), None)


class _EnumNote:
    """Drops torch's note that torchao's enums need no pytree registration any more (torchao registers them
    at import; transformers imports torchao's submodules while it loads a checkpoint): nothing the user did."""

    def filter(self, record: Any) -> bool:
        return "is an Enum subclass and is now natively supported" not in record.getMessage()


def torchao_notes_dropped() -> Any:
    """Context manager: :class:`_EnumNote` on torch's pytree logger inside the block."""
    import contextlib
    import logging

    @contextlib.contextmanager
    def dropped() -> Any:
        logger, note = logging.getLogger("torch.utils._pytree"), _EnumNote()
        logger.addFilter(note)
        try:
            yield
        finally:
            logger.removeFilter(note)

    return dropped()


def import_torchao_quietly() -> Any:
    """torchao (None when it is not installed), imported without its import-time log lines (its CUDA kernel
    libraries that do not load on a CPU-only install, torch's deprecation note on its enums): they say
    nothing about the user's model. transformers imports torchao when it loads a checkpoint if it is
    installed, so the model loader calls this first."""
    import importlib.util
    import logging
    import sys

    if "torchao" in sys.modules:
        return sys.modules["torchao"]
    if importlib.util.find_spec("torchao") is None:
        return None
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:
            q.setLevel(logging.ERROR)
        import torchao
        import torchao.quantization  # noqa: F401 - registers its enums now, quietly (transformers imports it on load)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return torchao


def _torchao() -> Any:
    torchao = import_torchao_quietly()
    if torchao is None:
        raise QuantizationError("quantization needs torchao: pip install 'superkernel[quant]' (or torchao>=0.18)")
    return torchao


def _config(row: Scheme, group_size: int | None, device: torch.device) -> Any:
    """torchao's config for ``row`` on ``device`` (refused where the scheme does not run)."""
    if device.type not in row.devices:
        raise QuantizationError(f"{row.name} runs on the {'/'.join(row.devices).upper()} only here; on {device.type}: "
                                f"{row.device_note or 'not supported'}")
    return row.make_config(group_size)


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(tensor_bytes(p) for p in model.parameters())


def tensor_bytes(p: torch.Tensor) -> int:
    """The bytes ``p`` holds: a torchao tensor's packed data and scales, or a plain tensor's elements."""
    inner = getattr(p, "qdata", None)
    if isinstance(inner, torch.Tensor):
        return sum(t.numel() * t.element_size() for t in _tensor_parts(p))
    return p.numel() * p.element_size()


def _tensor_parts(t: torch.Tensor) -> list[torch.Tensor]:
    names = getattr(t, "tensor_data_names", None) or [n for n in ("qdata", "scale", "zero_point") if hasattr(t, n)]
    return [getattr(t, n) for n in names if isinstance(getattr(t, n, None), torch.Tensor)]


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is a torchao quantized tensor."""
    return any(hasattr(p, "qdata") for p in model.parameters())


def extra_repr(self: torch.nn.Module) -> str:
    """A quantized linear's ``extra_repr``, as a plain function (named like the method it stands for)."""
    weight = getattr(self, "weight", None)
    return (f"in_features={getattr(self, 'in_features', '?')}, out_features={getattr(self, 'out_features', '?')}, "
            f"weight={type(weight).__name__}")


def _plain_extra_repr(model: torch.nn.Module) -> None:
    """torchao binds each quantized linear's ``extra_repr`` to the module as a method over a ``functools.partial``
    (int8 configs) or over a function of another name (``_linear_extra_repr``, the int4 config); Dynamo's guard
    serializer (a :func:`superkernel.precompile_step` frame) looks a bound method up on its object by the
    function's name, and fails on both. Bind a plain function of this module, named ``extra_repr``, instead (the
    printed line keeps the shapes and names the weight's class)."""
    import inspect
    import types

    for module in model.modules():
        bound = vars(module).get("extra_repr")
        if inspect.ismethod(bound) and getattr(bound.__func__, "__name__", None) != "extra_repr":
            module.extra_repr = types.MethodType(extra_repr, module)


def _refusal(name: str, module: torch.nn.Linear, row: Scheme) -> str | None:
    """Why ``row`` cannot take linear ``name`` (a ``skipped`` line), or None when it can."""
    dtype = str(module.weight.dtype).replace("torch.", "")
    if dtype not in row.weight_dtypes:
        return f"{name}: weight dtype {module.weight.dtype}"
    if module.out_features % row.out_multiple:
        return (f"{name}: {module.out_features} output features are not a multiple of {row.out_multiple} (the "
                "packed CPU int4 layout's)")
    return None


def _linears(model: torch.nn.Module, row: Scheme, skipped: list[str], apart: str | None = None) -> dict[str, int]:
    """name -> input features of the linear layers ``row`` can take, but ``apart``; the others are listed in
    ``skipped``."""
    out: dict[str, int] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == apart:
            continue
        why = _refusal(name, module, row)
        if why is None:
            out[name] = module.in_features
        else:
            skipped.append(why)
    return out


def quantize_model(model: torch.nn.Module, scheme: str, *, group_size: int | None = None,
                   head: str | None = None) -> Quantization:
    """Quantize ``model``'s linear layers in place with torchao (``scheme``: a key of :data:`SCHEMES`).

    Embeddings and norms stay float. A layer whose dtype or output width the scheme cannot take stays float and
    is listed in ``skipped``. A grouped scheme (int4) takes ``group_size`` when it divides every layer's input
    width, chooses one that does when none is given, and is refused otherwise (never a layer silently left
    float); a model with no linear layer it can quantize is an error. Returns what was done.

    The output head (``get_output_embeddings()``) takes ``head``: a scheme name or ``"float"``; by default the
    row's ``head`` (4-bit schemes: int8-weight), else ``scheme`` itself. A head tied to the input embedding gets
    its own quantized weight: the embedding stays float.
    """
    from superkernel.tools.quant_groups import GGUF_TYPE_TAG, GroupSizeError, choose

    scheme, group_size = check_scheme(scheme, group_size)
    head = check_head(scheme, head)
    row = SCHEMES[scheme]
    torchao = _torchao()
    if is_quantized(model):
        raise QuantizationError("the model is quantized already; quantize the float model once")
    from torchao.quantization import quantize_

    info = Quantization(scheme=scheme, library=f"torchao {torchao.__version__}",
                        weight_bytes_before=_param_bytes(model))
    head_name, head_row = output_head(model), SCHEMES.get(head)
    apart = head_name if head != scheme else None  # the head apart: float, or its own scheme
    wanted = _linears(model, row, info.skipped, apart)
    if apart is not None and head_row is not None:
        why = _refusal(apart, model.get_submodule(apart), head_row)
        if why is not None:
            info.skipped.append(why)
            head_name = None  # (the head's row cannot take it: stays float)
    elif apart is None and head_name not in wanted:
        head_name = None
    if not wanted:
        raise QuantizationError(f"{scheme}: the model has no linear layer it can quantize"
                                + (f" ({'; '.join(info.skipped[:3])})" if info.skipped else ""))
    if row.grouped:
        try:
            info.group_size, info.group_choice = choose(row, wanted, group_size, getattr(model, GGUF_TYPE_TAG, None))
        except GroupSizeError as exc:
            raise QuantizationError(str(exc)) from None
    device = next(model.parameters()).device
    config = _config(row, info.group_size, device)
    head_config = (_config(head_row, None, device) if head_name is not None and head not in (scheme, HEAD_FLOAT)
                   else None)
    chosen: list[str] = []

    def taker(names: dict[str, int] | set[str]) -> Any:
        def take(module: torch.nn.Module, name: str) -> bool:
            if isinstance(module, torch.nn.Linear) and name in names:
                chosen.append(name)
                return True
            return False
        return take

    if head_name is not None:
        info.head = f"{head_name}: {head}"
    quantize_(model, config, filter_fn=taker(wanted))
    if head_config is not None:  # (torchao gives a head tied to the embedding its own weight: the embedding stays)
        quantize_(model, head_config, filter_fn=taker({head_name}))
    _plain_extra_repr(model)
    info.layers = len(chosen)
    info.weight_bytes_after = _param_bytes(model)
    from superkernel.tools.advisor.precision import QUANTIZATION_TAG

    setattr(model, QUANTIZATION_TAG, scheme)  # precision gates read it (W8A8 rounds activations)
    return info


def float_decode_logits(session: Any, float_model: torch.nn.Module) -> torch.Tensor:
    """The unquantized model's decode logits over the session's tokens (step by step, as the quantized model runs)."""
    from superkernel.tools.decode import run_decode

    model, session.model = session.model, float_model
    try:
        with torch.no_grad():
            return run_decode(session, session.step_fn()).logits
    finally:
        session.model = model


def quantization_cost(session: Any, float_logits: torch.Tensor) -> dict[str, float]:
    """What quantization itself costs on this decode: the float model fed the session's tokens
    (``float_logits``, :func:`float_decode_logits`) against the quantized model step by step. Greedy-token
    agreement (argmax equal), max |logit difference|, mean KL(float || quantized) and mean cosine similarity."""
    from superkernel.tools.decode import run_decode

    with torch.no_grad():
        quantized = run_decode(session, session.step_fn()).logits.double()
    reference = float_logits.double()
    kl = torch.nn.functional.kl_div(quantized.log_softmax(-1), reference.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    return {"top1_agreement": float((reference.argmax(-1) == quantized.argmax(-1)).double().mean()),
            "max_abs_logit_diff": float((reference - quantized).abs().max()), "mean_kl": float(kl.mean()),
            "mean_cosine": float(torch.nn.functional.cosine_similarity(reference, quantized, dim=-1).mean()),
            "steps": int(quantized.shape[0])}


def describe_cost(info: dict[str, Any]) -> str:
    """One line of a report: the scheme, what it did to the weights, and its own error."""
    before, after = info.get("weight_bytes_before", 0), info.get("weight_bytes_after", 0)
    cost = info.get("cost") or {}
    choice = info.get("group_choice", "")
    why = (", chosen for " + ("the GGUF file's blocks" if "GGUF" in choice else "the layer widths")
           if choice.startswith("chosen") else "")
    head = info.get("head", "").partition(": ")
    line = (f"{info['scheme']}" + (f" (group {info['group_size']}{why})" if info.get("group_size") else "")
            + f" with {info.get('library', 'torchao')}: {info.get('layers', 0)} linear layers"
            + (f" (output head {head[0]}: {head[2]})" if head[2] and head[2] != info["scheme"] else "")
            + f", parameters {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    if cost:
        line += (f"; its own error against the float model fed the same tokens: greedy tokens agree on "
                 f"{cost['top1_agreement']:.1%} of {cost['steps']} steps, max |logit diff| {cost['max_abs_logit_diff']:.3g}, "
                 f"mean KL {cost['mean_kl']:.2e}, mean cosine {cost['mean_cosine']:.5f}")
    return line


__all__ = ["HEAD_FLOAT", "Quantization", "QuantizationError", "SCHEMES", "check_head", "check_scheme",
           "describe_cost", "float_decode_logits", "import_torchao_quietly", "is_quantized", "output_head",
           "quantization_cost", "quantize_model"]
