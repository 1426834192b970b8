"""Read and check a GGUF file's header before anything else touches the file.

A GGUF file is data from wherever the user got it: this parser reads only the header (key/value metadata and
the tensor table) with every length and count bounded by the file's own size, and checks that every tensor's
bytes lie inside the file, so a truncated or hostile file is refused in one line (:class:`GGUFError`) before
transformers' loader (which trusts the header) maps it. It answers what the report names: the architecture,
the file's quantization type, the tensor types. No torch, no gguf package: the layout is the GGUF
specification's (version 2 and 3, little-endian).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
#: Upper bounds that no real file reaches; each keeps a hostile count from making us loop or allocate.
MAX_STRING = 64 << 20
MAX_ITEMS = 1 << 24
MAX_DIMS = 8

#: GGML tensor type id -> (name, elements per block, bytes per block), as the GGUF specification lists them.
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

#: ``general.file_type`` (llama.cpp's ``LLAMA_FTYPE_*``) -> the name users know the file by.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}

# value type id -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
#: metadata arrays kept whole (the rest, e.g. a 49,152-token vocabulary, are skipped and only counted)
_KEEP_ARRAYS = 64


class GGUFError(ValueError):
    """A file that is not a readable GGUF file; the message is one line naming the file and the problem."""


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int   # from the start of the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES.get(self.type_id, (f"type {self.type_id}",))[0]


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else ""

    @property
    def name(self) -> str:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else ""

    @property
    def tensor_types(self) -> Counter:
        """Tensor type name -> number of tensors of that type."""
        return Counter(t.type_name for t in self.tensors)

    @property
    def file_type(self) -> str:
        """What the file is called by (``Q4_1``, ``Q8_0``, ``F16``, ...): ``general.file_type`` when it names one,
        else the type that holds most of the weights' bytes."""
        code = self.metadata.get("general.file_type")
        if isinstance(code, int) and code in FILE_TYPES:
            return FILE_TYPES[code]
        by_bytes: Counter = Counter()
        for t in self.tensors:
            by_bytes[t.type_name] += t.nbytes
        return by_bytes.most_common(1)[0][0] if by_bytes else "unknown"


class _Cursor:
    """Bounded little-endian reads over the mapped file; a read past the end is a truncated header."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"{self.path}: truncated GGUF header (reading {what} at byte {self.pos} of "
                            f"{self.size}); the file is incomplete or not a GGUF file")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def count(self, what: str, limit: int = MAX_ITEMS) -> int:
        n = self.unpack("<Q", what)
        if n > limit:
            raise GGUFError(f"{self.path}: {what} is {n}, more than a GGUF file can hold ({limit}); the file is corrupt")
        return n

    def string(self, what: str, keep: bool = True) -> str:
        n = self.count(f"the length of {what}", MAX_STRING)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n]) if keep else b""
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int, what: str, keep: bool = True) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id], what)
        if type_id == 8:
            return self.string(what, keep)
        if type_id == 9:
            item_type = self.unpack("<I", f"the item type of {what}")
            if item_type == 9:
                raise GGUFError(f"{self.path}: {what} is an array of arrays, which GGUF metadata does not use")
            n = self.count(f"the length of {what}")
            whole = keep and n <= _KEEP_ARRAYS
            if item_type in _SCALARS and not whole:  # skip fixed-size items at once
                size = struct.calcsize(_SCALARS[item_type])
                self.need(n * size, what)
                self.pos += n * size
                return n
            items = [self.value(item_type, what, whole) for _ in range(n)]
            return items if whole else n
        raise GGUFError(f"{self.path}: {what} has value type {type_id}, which GGUF does not define; "
                        "the file is corrupt or of a newer GGUF version")


def read_header(path: Path | str) -> GGUFHeader:
    """The header of the GGUF file ``path``, checked: magic, version, bounded metadata, every tensor's bytes
    inside the file. Raises :class:`GGUFError` with one line otherwise."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes is too short for a GGUF file (truncated or not GGUF)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, path), path, size)
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def _parse(cur: _Cursor, path: Path, size: int) -> GGUFHeader:
    if bytes(cur.buf[:4]) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
    cur.pos = 4
    version = cur.unpack("<I", "the version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")
    n_tensors = cur.count("the tensor count")
    n_kv = cur.count("the metadata count")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        type_id = cur.unpack("<I", f"the type of {key!r}")
        metadata[key] = cur.value(type_id, repr(key))
    header = GGUFHeader(path=path, version=version, metadata=metadata)
    for i in range(n_tensors):
        name = cur.string(f"tensor name {i}")
        n_dims = cur.unpack("<I", f"the dimensions of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} are possible)")
        shape = tuple(cur.unpack("<Q", f"the shape of {name!r}") for _ in range(n_dims))
        type_id = cur.unpack("<I", f"the type of {name!r}")
        offset = cur.unpack("<Q", f"the offset of {name!r}")
        header.tensors.append(TensorInfo(name, shape, type_id, offset, _nbytes(path, name, shape, type_id)))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two")
    header.data_start = -(-cur.pos // alignment) * alignment
    for t in header.tensors:
        end = header.data_start + t.offset + t.nbytes
        if end > size:
            raise GGUFError(f"{path}: truncated: tensor {t.name!r} ends at byte {end} but the file has {size} bytes")
    return header


def _nbytes(path: Path, name: str, shape: tuple[int, ...], type_id: int) -> int:
    if type_id not in TENSOR_TYPES:
        raise GGUFError(f"{path}: tensor {name!r} has GGML type {type_id}, which this reader does not know")
    _, block, block_bytes = TENSOR_TYPES[type_id]
    elements = 1
    for d in shape:
        elements *= d
        if elements > 1 << 48:
            raise GGUFError(f"{path}: tensor {name!r} has an impossible shape {shape}")
    if elements % block:
        raise GGUFError(f"{path}: tensor {name!r} ({elements} elements) is not whole blocks of {block} "
                        f"for its type {TENSOR_TYPES[type_id][0]}")
    return elements // block * block_bytes


__all__ = ["FILE_TYPES", "GGUFError", "GGUFHeader", "TENSOR_TYPES", "TensorInfo", "read_header"]
