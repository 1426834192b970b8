"""argparse value types shared by the command lines."""

from __future__ import annotations

import argparse
from typing import Callable


def positive_int(name: str) -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers >= 1 and names the flag in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse
