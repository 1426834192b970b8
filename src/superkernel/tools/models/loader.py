"""Load a model by zoo name, a real model's name, a local Hugging Face checkpoint directory or a GGUF file.

Every failure is a :class:`ModelLoadError` with a one-line message that says what
was wrong and what would work, so the command line can print it without a traceback.
Only safetensors and GGUF weights are read (never pickle files); a GGUF file is converted once through
transformers' GGUF loader and kept (:mod:`.gguf_load`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from superkernel.tools.models.real import REAL_MODELS, RealModelMissing, locate, real_listing
from superkernel.tools.models.zoo import ZOO, zoo_listing
from superkernel.util import InputFileError, json_depth, read_limited, safe_text

MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_DEPTH = 64


class ModelLoadError(ValueError):
    """A model name or checkpoint directory that cannot be loaded."""


@dataclass
class LoadedModel:
    name: str                 # zoo name, real model name, checkpoint directory or GGUF file
    source: str               # "zoo", "checkpoint" or "gguf"
    model: torch.nn.Module
    architecture: str
    notes: list[str] = field(default_factory=list)
    dtype_source: str = "default"   # "--dtype", "checkpoint" or "default" (float32)
    #: what superkernel.tools.quantize did to the model (Quantization.to_dict() + its "cost"); None: float
    quantization: dict | None = None
    #: a GGUF source: gguf_load.describe() (its architecture, file type, tensor types); None otherwise
    gguf: dict | None = None
    #: the folder whose tokenizer files belong to the model (checkpoints, converted GGUF); None: no tokenizer
    tokenizer_dir: Path | None = None
    #: the workflow's evaluation text (tools/advisor/text_eval.TextEval), set by load_and_prepare
    text_eval: object = None

    def tokenizer(self):
        """The model's tokenizer (transformers ``AutoTokenizer``, from files only), or None where it has none."""
        if self.tokenizer_dir is None:
            return None
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.tokenizer_dir), local_files_only=True, trust_remote_code=False)
        except Exception:  # a checkpoint without (readable) tokenizer files
            return None

    @property
    def config(self):
        return self.model.config

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def looks_like_path(spec: str) -> bool:
    return (os.sep in spec or spec.startswith(".") or spec.startswith("~") or spec.lower().endswith(".gguf")
            or os.path.exists(spec))


#: --dtype names -> torch dtypes (decode runs in one dtype; weights are cast on load).
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``None`` stays None (the checkpoint's dtype); a name from DTYPES, else ValueError listing them."""
    if name is None or isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"--dtype {name!r} is not supported; choose float32, float16 or bfloat16")
    return DTYPES[key]


def _checkpoint_dtype(raw: dict) -> torch.dtype | None:
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key)
        if isinstance(value, str):
            found = DTYPES.get(value.lower().removeprefix("torch."))
            if found is not None:
                return found
    text = raw.get("text_config")
    return _checkpoint_dtype(text) if isinstance(text, dict) else None


def load_model(spec: str, *, seed: int = 0, device: str | torch.device = "cpu",
               dtype: str | torch.dtype | None = None) -> LoadedModel:
    """Build a zoo model (seeded random weights) or load a local checkpoint directory.

    ``dtype`` None: the checkpoint's dtype (``dtype``/``torch_dtype`` in config.json), float32
    for zoo models and checkpoints that name none.
    """
    wanted = parse_dtype(dtype)
    if not isinstance(spec, str) or not spec:
        raise ModelLoadError(f"--model must be a zoo name or a checkpoint directory, got {spec!r}")
    if spec in ZOO:
        from superkernel.tools.quantize import import_torchao_quietly, torchao_notes_dropped

        import_torchao_quietly()  # transformers imports it while it builds a model; its import logs nothing of use
        with torchao_notes_dropped():
            loaded = _build_zoo(spec, seed)
        if wanted is not None and wanted != torch.float32:
            loaded.model.to(wanted)
        loaded.dtype_source = "--dtype" if wanted is not None else "default (zoo models run in float32)"
    elif spec in REAL_MODELS:
        try:
            path = locate(spec)
        except RealModelMissing as exc:
            raise ModelLoadError(str(exc)) from None
        loaded = _load_gguf(path, wanted, name=spec)
    elif looks_like_path(spec) and is_gguf(Path(spec).expanduser()):
        loaded = _load_gguf(Path(spec).expanduser(), wanted)
    elif looks_like_path(spec):
        loaded = _load_checkpoint(Path(spec).expanduser(), wanted)
    else:
        raise ModelLoadError(f"unknown model {spec!r}: give a zoo model ({zoo_listing()}), a real model "
                             f"({real_listing()}), a local checkpoint directory (config.json + *.safetensors) "
                             "or a GGUF file")
    loaded.model.to(device).eval().requires_grad_(False)
    return loaded


def is_gguf(path: Path) -> bool:
    """A file named ``*.gguf`` or starting with GGUF's magic bytes (directories are checkpoints)."""
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _load_gguf(path: Path, wanted: torch.dtype | None, name: str | None = None) -> LoadedModel:
    """A GGUF file through its converted folder (gguf_load.converted_folder), loaded as a checkpoint."""
    from superkernel.tools.models.gguf_header import GGUFError
    from superkernel.tools.models.gguf_load import converted_folder, describe, source_of

    if not path.exists():
        raise ModelLoadError(f"GGUF file {safe_text(path)!r} does not exist")
    if path.is_dir():
        raise ModelLoadError(f"{safe_text(path)!r} is a directory; --model takes the GGUF file itself")
    try:
        folder, header = converted_folder(path)
    except GGUFError as exc:
        raise ModelLoadError(_one_line(exc)) from None
    except OSError as exc:  # the cache directory (CacheDirError) or a disk error while converting
        raise ModelLoadError(f"cannot convert {safe_text(path)!r}: {_one_line(exc)}") from None
    loaded = _load_checkpoint(folder, wanted)
    info = describe(header)
    loaded.name, loaded.source, loaded.gguf = name or str(path), "gguf", info
    from superkernel.tools.quant_groups import GGUF_TYPE_TAG

    setattr(loaded.model, GGUF_TYPE_TAG, info["file_type"])  # an int4 requantization stays on the file's grid
    if wanted is None:
        loaded.dtype_source = "default (GGUF weights are dequantized to float32)"
    types = ", ".join(f"{n} {t}" for t, n in info["tensor_types"].items())
    dtype = str(next(loaded.model.parameters()).dtype).replace("torch.", "")
    loaded.notes = [f"GGUF {info['file_type']} ({types} tensors) of {path.name}, dequantized by transformers, "
                    f"run in {dtype}"]
    loaded.tokenizer_dir = folder if source_of(folder).get("tokenizer") else None
    return loaded


def _build_zoo(name: str, seed: int) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    entry = ZOO[name]
    config = entry.make_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return LoadedModel(name=name, source="zoo", model=model, architecture=type(model).__name__,
                       notes=[f"random weights, seed {seed}"])


def _load_checkpoint(path: Path, wanted: torch.dtype | None = None) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not path.exists():
        raise ModelLoadError(f"checkpoint directory {str(path)!r} does not exist (zoo models: {', '.join(ZOO)})")
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is a file; --model needs a checkpoint directory with config.json and "
                             "*.safetensors, or a GGUF file")
    config_file = path / "config.json"
    if not config_file.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if ggufs:
            raise ModelLoadError(f"{str(path)!r} is a directory without config.json; for its GGUF file pass the file "
                                 f"itself: --model {safe_text(path / ggufs[0])}")
        raise ModelLoadError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        text = read_limited(config_file, MAX_CONFIG_BYTES, "config.json").decode("utf-8")
        json_depth(text, MAX_CONFIG_DEPTH)  # before the recursive parser (a RecursionError otherwise)
        raw = json.loads(text)
    except InputFileError as exc:
        raise ModelLoadError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelLoadError(f"{safe_text(config_file)} is not valid JSON: {_one_line(exc)}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ModelLoadError(f"{config_file} has no \"model_type\"; it is not a Hugging Face model config")
    if not isinstance(raw["model_type"], str):
        raise ModelLoadError(f"{config_file}: \"model_type\" must be a string, got {safe_text(repr(raw['model_type']), 80)}")
    if "auto_map" in raw:  # custom code: never run it (trust_remote_code is always False)
        raise ModelLoadError(f"checkpoint {str(path)!r} needs custom Python code (config.json has \"auto_map\"); "
                             "superkernel never runs code from a checkpoint (trust_remote_code=False): use a model_type "
                             "transformers implements, or load the model yourself and call superkernel.apply")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        extra = f" (found {', '.join(pickles[:3])}: pickle weights are not loaded; convert them to safetensors)" if pickles else ""
        raise ModelLoadError(f"checkpoint directory {str(path)!r} has no *.safetensors weights{extra}")
    from superkernel.tools.quantize import import_torchao_quietly, torchao_notes_dropped

    import_torchao_quietly()  # transformers imports it while loading when it is installed; its import logs nothing of use
    with _library_messages() as held, torchao_notes_dropped():  # shown only when the checkpoint loads
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # transformers raises ValueError/KeyError/OSError for unknown or broken configs
            raise ModelLoadError(f"cannot read {config_file}: {_one_line(exc)}") from None
        dtype = wanted or _checkpoint_dtype(raw) or torch.float32
        dtype_source = "--dtype" if wanted is not None else ("checkpoint" if _checkpoint_dtype(raw) else
                                                             "default (the checkpoint names no dtype)")
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # our own progress display; keep stderr to one line per error
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path), config=config, local_files_only=True, use_safetensors=True, dtype=dtype,
                output_loading_info=True, trust_remote_code=False)
        except ValueError as exc:
            if "Unrecognized configuration class" in str(exc):
                raise ModelLoadError(f"{str(path)!r}: model_type {safe_text(raw['model_type'], 80)!r} is not a causal language model "
                                     "transformers knows (AutoModelForCausalLM)") from None
            raise ModelLoadError(f"cannot load checkpoint {str(path)!r}: {_one_line(exc)}") from None
        except Exception as exc:  # corrupt safetensors, shape mismatches, ...
            raise ModelLoadError(f"cannot load checkpoint {str(path)!r}: {_one_line(exc)}") from None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
    _show(held)
    missing = [k for k in info.get("missing_keys", []) if not _is_tied(model, k)]
    if missing:
        raise ModelLoadError(f"checkpoint {str(path)!r} lacks {len(missing)} weight(s) the model needs, "
                             f"e.g. {', '.join(sorted(missing)[:3])}; it would run with random weights")
    _own_memory(model)
    notes = [f"{len(weights)} safetensors file(s)"]
    if info.get("unexpected_keys"):
        notes.append(f"{len(info['unexpected_keys'])} unused tensor(s) in the checkpoint ignored")
    return LoadedModel(name=str(path), source="checkpoint", model=model, architecture=type(model).__name__, notes=notes,
                       dtype_source=dtype_source,
                       tokenizer_dir=path if any((path / f).is_file() for f in _TOKENIZER_FILES) else None)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _own_memory(model: torch.nn.Module) -> None:
    """Copy the weights out of the safetensors file mapping transformers leaves them in, into
    this process's own memory: every peer (eager, torch.compile, a plan on its deep copy) then
    reads weights from the same kind of memory, on the same page setting (huge pages where the CLI
    set them: superkernel.hugepages). Tied weights stay tied (one Parameter, copied once)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    """lm_head.weight may be absent when tied to the embedding."""
    return key.endswith("lm_head.weight") and bool(getattr(model.config, "tie_word_embeddings", False))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return safe_text(text, 300) if text else type(exc).__name__


@contextlib.contextmanager
def _library_messages() -> Iterator[list[logging.LogRecord]]:
    """Hold what transformers logs or warns while a checkpoint loads (its text comes from the checkpoint's
    config): dropped when loading fails (the one-line error says what matters), shown afterwards one
    sanitized line each when it succeeds."""
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    logger = logging.getLogger("transformers")
    saved, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [Hold()], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield held
    finally:
        logger.handlers, logger.propagate = saved, propagate
    for w in caught:
        held.append(logging.LogRecord("transformers", logging.WARNING, "", 0, str(w.message), None, None))


def _show(held: list[logging.LogRecord]) -> None:
    for record in held[:20]:
        if record.levelno >= logging.WARNING:
            print(f"superkernel: note from transformers: {safe_text(' '.join(record.getMessage().split()), 300)}",
                  file=sys.stderr)
