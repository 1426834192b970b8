"""Load a model by zoo name or from a local Hugging Face checkpoint directory.

Every failure is a :class:`ModelLoadError` with a one-line message that says what
was wrong and what would work, so the command line can print it without a traceback.
Only safetensors weights are read (never pickle files).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from superkernel.tools.models.zoo import ZOO, zoo_listing


class ModelLoadError(ValueError):
    """A model name or checkpoint directory that cannot be loaded."""


@dataclass
class LoadedModel:
    name: str                 # zoo name or the checkpoint directory
    source: str               # "zoo" or "checkpoint"
    model: torch.nn.Module
    architecture: str
    notes: list[str] = field(default_factory=list)

    @property
    def config(self):
        return self.model.config

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def looks_like_path(spec: str) -> bool:
    return os.sep in spec or spec.startswith(".") or spec.startswith("~") or os.path.exists(spec)


def load_model(spec: str, *, seed: int = 0, device: str | torch.device = "cpu") -> LoadedModel:
    """Build a zoo model (seeded random weights) or load a local checkpoint directory."""
    if spec in ZOO:
        loaded = _build_zoo(spec, seed)
    elif looks_like_path(spec):
        loaded = _load_checkpoint(Path(spec).expanduser())
    else:
        raise ModelLoadError(f"unknown model {spec!r}: give a zoo model ({zoo_listing()}) "
                             "or a local checkpoint directory (config.json + *.safetensors)")
    loaded.model.to(device).eval().requires_grad_(False)
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


def _load_checkpoint(path: Path) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not path.exists():
        raise ModelLoadError(f"checkpoint directory {str(path)!r} does not exist (zoo models: {', '.join(ZOO)})")
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is a file; --model needs a checkpoint directory with config.json and *.safetensors")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ModelLoadError(f"{config_file} has no \"model_type\"; it is not a Hugging Face model config")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        extra = f" (found {', '.join(pickles[:3])}: pickle weights are not loaded; convert them to safetensors)" if pickles else ""
        raise ModelLoadError(f"checkpoint directory {str(path)!r} has no *.safetensors weights{extra}")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises ValueError/KeyError/OSError for unknown or broken configs
        raise ModelLoadError(f"cannot read {config_file}: {_one_line(exc)}") from None
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), config=config, local_files_only=True, use_safetensors=True, dtype=torch.float32,
            output_loading_info=True)
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise ModelLoadError(f"{str(path)!r}: model_type {raw['model_type']!r} is not a causal language model "
                                 "transformers knows (AutoModelForCausalLM)") from None
        raise ModelLoadError(f"cannot load checkpoint {str(path)!r}: {_one_line(exc)}") from None
    except Exception as exc:  # corrupt safetensors, shape mismatches, ...
        raise ModelLoadError(f"cannot load checkpoint {str(path)!r}: {_one_line(exc)}") from None
    missing = [k for k in info.get("missing_keys", []) if not _is_tied(model, k)]
    if missing:
        raise ModelLoadError(f"checkpoint {str(path)!r} lacks {len(missing)} weight(s) the model needs, "
                             f"e.g. {', '.join(sorted(missing)[:3])}; it would run with random weights")
    notes = [f"{len(weights)} safetensors file(s)"]
    if info.get("unexpected_keys"):
        notes.append(f"{len(info['unexpected_keys'])} unused tensor(s) in the checkpoint ignored")
    return LoadedModel(name=str(path), source="checkpoint", model=model, architecture=type(model).__name__, notes=notes)


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    """lm_head.weight may be absent when tied to the embedding."""
    return key.endswith("lm_head.weight") and bool(getattr(model.config, "tie_word_embeddings", False))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else (text or type(exc).__name__)
