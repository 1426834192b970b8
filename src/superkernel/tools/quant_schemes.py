"""The quantization schemes ``--quantize`` takes, without importing torch (the CLI's --help lists them)."""

from __future__ import annotations

#: scheme name -> what it is (``--quantize`` choices, plan files, reports)
SCHEMES: dict[str, str] = {
    "int8-weight": "int8 weight-only: int8 weights with one scale per output channel; activations stay float",
    "w8a8": "int8 dynamic activation (one scale per token) + int8 weight (one scale per output channel): the "
            "seed's quantized matmul",
    "int4-weight": "int4 weight-only: int4 weights in groups (scale and zero point per group), CPU packed layout "
                   "(torchao's Int4OpaqueTensor, ATen's _weight_int4pack_mm_for_cpu)",
}
INT4_GROUP_SIZES = (32, 64, 128, 256)
DEFAULT_INT4_GROUP = 128
#: ATen's CPU int4 packing (``_convert_weight_to_int4pack_for_cpu``) takes output features in multiples of this
INT4_OUT_MULTIPLE = 16
