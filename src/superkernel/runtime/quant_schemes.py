"""The quantization schemes, one row each: the table ``--quantize``, plan files, ``quantize_model``, the max-autotune
rewrite and the native kernels all read (DESIGN.md §5a).

A row says what a scheme is called (its CLI name, what reports and ``explain()`` call it), which torchao config makes
it, which graph pattern our rewrite turns into which of our native kernels, and its limits (group sizes, weight
dtypes, devices, output-width multiple, the layers it takes). A new scheme is one row here plus its kernels: the C++
op in :mod:`superkernel.runtime.cpu.quant_kernels_source` and the function that rewrites torchao's graph pattern
into a call of it (named by ``rewrite``). A 4-bit row keeps the model's output head at int8 (``head``): on SmolLM2-135M
its int4 head alone cost a mean KL of 6e-2 on real text, the int8 head 1e-3 (llama.cpp keeps its 4-bit files' output
tensor at 6 or 8 bits: SmolLM2's Q4_1 and Q4_0 files hold it as Q8_0). Torch-free: the CLI's ``--help`` lists the
rows without importing torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

#: the weight dtypes a scheme quantizes (a linear in another dtype stays float, listed as skipped)
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Ref:
    """A torch or torchao object a config takes, named here so that the table imports neither."""

    path: str                        # "module:attr" (a dotted attr: "module:Enum.MEMBER")


@dataclass(frozen=True)
class Kernel:
    """One of our native operators, ``torch.ops.superkernel.<op>(x, w, ...) -> [M, N]``."""

    op: str
    out_dtype: str                   # its result's dtype ("int32": an exact integer dot; "float32")
    replaces: str                    # the graph pattern it stands for (docs)


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme (see module doc)."""

    name: str                                      # --quantize NAME, plan files, results
    summary: str                                   # --help
    report_name: str                               # explain()'s rewrite lines and reports
    config: str                                    # "module:Class" of torchao's config
    kernels: tuple[Kernel, ...]                    # our native kernels for its decode GEMVs
    rewrite: str                                   # "module:function" (gm, scheme) -> explain lines
    group_sizes: tuple[int, ...] = ()              # the sizes a grouped scheme takes; (): one scale per channel
    auto_groups: tuple[int, ...] = ()              # tried in order when none is given: the first dividing every layer
    out_multiple: int = 1                          # output features must be a multiple of this (else stays float)
    weight_dtypes: tuple[str, ...] = FLOAT_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    device_note: str = ""                          # why not elsewhere (the refusal's text)
    layers: str = "torch.nn.Linear"                # the modules it quantizes; embeddings and norms stay float
    rounds_activations: bool = False               # activations quantized per token (precision gates widen)
    config_kwargs: tuple[tuple[str, Any], ...] = field(default=(("set_inductor_config", False),))
    group_arg: str = "group_size"                  # the config's keyword for the group size
    group_wrap: str = ""                           # "module:Class" wrapping the size (torchao's PerGroup), if any
    head: str = ""                                 # the scheme of the output head (lm_head); "": this row's own

    @property
    def grouped(self) -> bool:
        return bool(self.group_sizes)

    def make_config(self, group_size: int | None = None) -> Any:
        """torchao's config for this scheme (imports torchao; ``group_size`` for a grouped scheme)."""
        kwargs = {k: resolve(v.path) if isinstance(v, Ref) else v for k, v in self.config_kwargs}
        if self.grouped:
            kwargs[self.group_arg] = resolve(self.group_wrap)(group_size) if self.group_wrap else group_size
        return resolve(self.config)(**kwargs)

    def rewriter(self) -> Callable[..., list[str]]:
        return resolve(self.rewrite)


def resolve(path: str) -> Any:
    """The object a ``"module:name"`` path names (``name`` may be dotted)."""
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


_GEMV = "superkernel.runtime.inductor.quant_gemv"
_ROWS = (
    Scheme("int8-weight",
           "int8 weight-only: int8 weights with one scale per output channel; activations stay float",
           "int8 weight-only", "torchao.quantization:Int8WeightOnlyConfig",
           (Kernel("int8_weight_gemv", "float32", "mm(x, float32(w_int8).T), float32 x"),),
           f"{_GEMV}:rewrite_int8_weight"),
    Scheme("w8a8",
           "int8 dynamic activation (one scale per token) + int8 weight (one scale per output channel): the "
           "seed's quantized matmul",
           "W8A8", "torchao.quantization:Int8DynamicActivationInt8WeightConfig",
           (Kernel("int8_gemv", "int32", "_int_mm(uint8(x_int8 + 128), w_int8.T) - 128 * colsum(w_int8.T)"),),
           f"{_GEMV}:rewrite_w8a8", rounds_activations=True),
    Scheme("int4-weight",
           "int4 weight-only: int4 weights in groups (scale and zero point per group; by default 32 for a GGUF "
           "file of 4-bit blocks of 32, else the largest of 128, 64, 32 dividing every layer's input width), CPU "
           "packed layout (torchao's Int4OpaqueTensor, ATen's _weight_int4pack_mm_for_cpu); the output head int8",
           "int4 weight-only",
           "torchao.prototype.quantization.int4.inference_workflow:PrototypeInt4WeightOnlyConfig",
           (Kernel("int4_weight_gemv", "float32", "_weight_int4pack_mm_for_cpu(x, w, group, scales_and_zeros)"),),
           f"{_GEMV}:rewrite_int4", group_sizes=(32, 64, 128, 256), auto_groups=(128, 64, 32),
           out_multiple=16,  # ATen's CPU int4 packing (_convert_weight_to_int4pack_for_cpu)
           devices=("cpu",), device_note="torchao's CUDA int4 needs its mslk kernels, which this install does not "
                                         "have. Use int8-weight or w8a8",
           head="int8-weight"),
    Scheme("w4a8",
           "int4 weights (symmetric, one scale per block of 32 by default, as llama.cpp's Q4_0) x int8 dynamic "
           "activations (one scale and zero point per token): integer dot products per block; the output head int8",
           "W4A8", "torchao.quantization:Int8DynamicActivationIntxWeightConfig",
           (Kernel("int4_int8_gemv", "float32",
                   "mm((float(x_int8) - zx) * sx, ((float(w_int4) - zw) * sw).view(N, K).T)"),),
           "superkernel.runtime.inductor.w4a8_gemv:rewrite_w4a8", group_sizes=(32, 64, 128, 256), auto_groups=(32,),
           devices=("cpu",), device_note="its integer kernel is a CPU one (AVX2 / plain loop); use int8-weight or w8a8",
           rounds_activations=True,
           config_kwargs=(("weight_dtype", Ref("torch:int4")),
                          ("weight_mapping_type", Ref("torchao.quantization.quant_primitives:MappingType.SYMMETRIC"))),
           group_arg="weight_granularity", group_wrap="torchao.quantization.granularity:PerGroup",
           head="int8-weight"),
)
#: scheme name -> its row (``--quantize`` choices, in this order)
SCHEMES: dict[str, Scheme] = {row.name: row for row in _ROWS}


def scheme(name: str) -> Scheme | None:
    return SCHEMES.get(name)


def grouped_names() -> list[str]:
    """The schemes that take a group size."""
    return [row.name for row in SCHEMES.values() if row.grouped]


def group_sizes() -> tuple[int, ...]:
    """Every group size some scheme takes (``--group-size`` choices)."""
    return tuple(sorted({g for row in SCHEMES.values() for g in row.group_sizes}))


def kernels() -> list[Kernel]:
    """Every scheme's native kernels, once each."""
    return list({k.op: k for row in SCHEMES.values() for k in row.kernels}.values())


def kernel(op: str) -> Kernel:
    return next(k for k in kernels() if k.op == op)


__all__ = ["FLOAT_DTYPES", "Kernel", "Ref", "SCHEMES", "Scheme", "group_sizes", "grouped_names", "kernel", "kernels",
           "resolve", "scheme"]
