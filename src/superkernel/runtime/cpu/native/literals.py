"""C++ literals for the generated code, and the errors of the native path."""

from __future__ import annotations

import math

import torch



class NativeUnsupported(Exception):
    """The segment contains something the native emitter does not express (it runs flat instead)."""


class NativeBuildError(RuntimeError):
    """The C++ compiler failed (the message carries the end of its output)."""


# --- C++ literals --------------------------------------------------------------------------

_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
_LAYOUTS = {torch.strided: "Strided"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "Contiguous", torch.preserve_format: "Preserve",
    torch.channels_last: "ChannelsLast", torch.channels_last_3d: "ChannelsLast3d",
}


def _int_literal(v: int) -> str:
    v = int(v)
    if not -(2**63) <= v < 2**63:
        raise NativeUnsupported(f"integer {v} does not fit int64")
    if v == -(2**63):
        return "(int64_t)(-9223372036854775807LL - 1)"
    return f"(int64_t){v}LL"


def _double_literal(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(v):
        return ("" if v > 0 else "-") + "std::numeric_limits<double>::infinity()"
    return f"(double){v.hex()}"  # a hexadecimal literal: exact


def _string_literal(s: str) -> str:
    out = []
    for byte in s.encode("utf-8"):
        ch = chr(byte)
        out.append(ch if 32 <= byte < 127 and ch not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'
