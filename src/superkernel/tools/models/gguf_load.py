"""GGUF files in: a llama.cpp user's model file, read through transformers' GGUF loader and kept converted.

The header is checked first (:mod:`.gguf_header`: truncated, corrupt, an architecture or tensor type transformers
cannot read: one line, nothing written). transformers then dequantizes every tensor to float32
(``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` and ``accelerate`` packages of
``superkernel[tools]``). transformers parses the file's header (with the whole vocabulary) once for the config,
once for the weights and again for the tokenizer, and builds gguf's tensor-name map once per submodule: 43 s for
SmolLM2-135M on 2 cores, 34 s of it those repeats. :func:`_parse_once` hands transformers one parse and one map
per conversion (both are read-only: a memory map of the file, a table of names). The result is kept as a plain
checkpoint folder (``config.json``, ``model.safetensors``, the tokenizer's JSON files) in superkernel's private
cache, named by the file's SHA-256: later loads read that folder in about a second, and a changed file gets a new
folder. Nothing in it is code: weights, config and tokenizer are data, loaded with ``trust_remote_code=False``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from superkernel.tools.models.gguf_header import GGUFError, GGUFHeader, read_header

CACHE_SUBDIR = "gguf"
#: what a converted folder records about its source (its presence marks the folder complete)
SOURCE_NAME = "superkernel-gguf.json"
#: bump when the converted folder's layout changes: older folders are then converted again
#: (2: config.json names the causal-LM class in ``architectures``, as ``save_pretrained`` writes it; without it
#: vLLM reads the folder as a bare ``LlamaModel`` with no head and generates empty text; a tied head is stored
#: under the input embedding's name)
FORMAT = 2
#: tensor types that are plain floats (transformers converts them without the gguf package's dequantizers)
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def supported_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def readable_types() -> set[str]:
    """Tensor types transformers can dequantize: the float types and those the gguf package implements."""
    from gguf.quants import _type_traits  # the gguf package's table of dequantizers (transformers calls them)

    return _FLOAT_TYPES | {t.name for t in _type_traits}


def check_readable(header: GGUFHeader) -> None:
    """Refuse (:class:`GGUFError`) a file whose architecture or tensor types transformers cannot read."""
    try:
        archs = supported_architectures()
        types = readable_types()
    except ImportError as exc:
        raise GGUFError(f"reading GGUF files needs the packages gguf and accelerate (pip install 'superkernel[tools]'):"
                        f" {exc}") from None
    arch = header.architecture
    if not arch:
        raise GGUFError(f"{header.path}: the file names no general.architecture; it is not a model GGUF")
    if arch.replace("-", "_") not in archs and arch not in archs:
        raise GGUFError(f"{header.path}: architecture {arch!r} cannot be read by transformers' GGUF loader "
                        f"(it reads: {', '.join(sorted(archs))})")
    unreadable = sorted(set(header.tensor_types) - types)
    if unreadable:
        raise GGUFError(f"{header.path}: tensor type(s) {', '.join(unreadable)} cannot be dequantized by transformers "
                        f"(it reads: {', '.join(sorted(types))})")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def describe(header: GGUFHeader) -> dict[str, Any]:
    """What the report and results.json say of the file."""
    return {"path": str(header.path), "architecture": header.architecture, "name": header.name,
            "file_type": header.file_type, "tensor_types": dict(header.tensor_types.most_common()),
            "tensors": len(header.tensors), "gguf_version": header.version}


def converted_folder(path: Path, *, quiet: bool = False) -> tuple[Path, GGUFHeader]:
    """The plain checkpoint folder of GGUF file ``path``: from the cache, or converted now (with a lock, so
    two processes convert once). Raises :class:`GGUFError` for a file that cannot be read."""
    from filelock import FileLock

    from superkernel.cache_dir import private_cache_dir

    header = read_header(path)
    check_readable(header)
    root = private_cache_dir(CACHE_SUBDIR)
    folder = root / f"{file_digest(path)[:40]}-v{FORMAT}"
    with FileLock(str(folder) + ".lock"):
        if _complete(folder):
            return folder, header
        if folder.exists():
            shutil.rmtree(folder)
        if not quiet:
            print(f"superkernel: converting {path.name} ({header.file_type}, {header.architecture}) once with "
                  f"transformers' GGUF loader; kept in {root}", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=root))
        try:
            _convert(path, header, tmp)
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder, header


def _complete(folder: Path) -> bool:
    try:
        meta = json.loads((folder / SOURCE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


@contextlib.contextmanager
def _parse_once() -> Iterator[None]:
    """While converting, ``gguf.GGUFReader(path)`` and ``gguf.get_tensor_name_map(arch, n)`` give the object made
    on their first call for the same arguments (transformers imports both from ``gguf`` inside its functions, so
    the ``gguf`` module's attributes are what it calls). Restored after."""
    import unittest.mock

    import gguf

    readers: dict[str, Any] = {}
    maps: dict[tuple[Any, ...], Any] = {}
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return reader_class(path, *args, **kwargs)
        key = os.path.realpath(os.fspath(path))
        if key not in readers:
            readers[key] = reader_class(path)
        return readers[key]

    def tensor_name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[(arch, n_blocks)] = name_map(arch, n_blocks)
        return maps[(arch, n_blocks)]

    with unittest.mock.patch.object(gguf, "GGUFReader", reader), \
            unittest.mock.patch.object(gguf, "get_tensor_name_map", tensor_name_map):
        yield


def _convert(path: Path, header: GGUFHeader, out: Path) -> None:
    with _parse_once():
        _convert_parsing_once(path, header, out)


def _convert_parsing_once(path: Path, header: GGUFHeader, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                         local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # transformers' GGUF mapping raises ValueError/KeyError/RuntimeError
            raise GGUFError(f"{path}: transformers cannot load it: {_one_line(exc)}") from None
        _save_plain(model, out)
        del model
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True,
                                                      trust_remote_code=False)
            tokenizer.save_pretrained(str(out))
            has_tokenizer = True
        except Exception:  # a model file without a tokenizer transformers can rebuild: weights only
            has_tokenizer = False
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (out / SOURCE_NAME).write_text(json.dumps({"format": FORMAT, "source": describe(header),
                                               "tokenizer": has_tokenizer}, indent=1))


def _save_plain(model: Any, out: Path) -> None:
    """The dequantized model as a plain checkpoint: transformers refuses ``save_pretrained`` on a model it loaded
    from GGUF, so the config (without its GGUF quantization record) and the weights (safetensors; tied weights
    once) are written here."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=1, default=str))
    save_file(_tied_once(model), str(out / "model.safetensors"), metadata={"format": "pt"})


def _tied_once(model: Any) -> dict[str, Any]:
    """The state dict with each tied tensor once, under the name a loader looks for: the input embedding's (as
    ``save_pretrained`` keeps it). safetensors' ``save_model`` kept ``lm_head.weight``, which transformers reads
    back but vLLM skips for a tied head, leaving a zero embedding (every token id 0)."""
    state = model.state_dict()
    embedding = model.get_input_embeddings()
    preferred = next((f"{n}.weight" for n, m in model.named_modules() if embedding is not None and m is embedding),
                     None)
    kept: dict[Any, str] = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key not in kept or name == preferred:
            kept[key] = name
    return {name: state[name].contiguous() for name in kept.values()}


def source_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / SOURCE_NAME).read_text())


def _one_line(exc: BaseException) -> str:
    from superkernel.util import safe_text

    text = " ".join(str(exc).split())
    return safe_text(text, 300) if text else type(exc).__name__


__all__ = ["CACHE_SUBDIR", "check_readable", "converted_folder", "describe", "readable_types", "source_of",
           "supported_architectures"]
