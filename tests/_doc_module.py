"""The namespace a documented Python block runs in."""

from __future__ import annotations

import sys
import types


_made = 0


def doc_module(monkeypatch) -> types.ModuleType:
    """A module to run a block in, as a script runs in ``__main__``: importable by its name while it runs
    (torch 2.11's Dynamo imports the module a compiled function's globals name; a bare dict failed there),
    a new name for each block (on 2.11, with one name, a later block's precompiled step read an earlier
    block's module)."""
    global _made
    _made += 1
    module = types.ModuleType(f"__doc_example_{_made}__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module
