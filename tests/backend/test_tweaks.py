"""The list of Inductor internals superkernel patches (runtime/inductor/tweaks.py) against the installed torch."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from superkernel.runtime.inductor import tweaks


def test_every_name_a_tweak_touches_exists_in_this_torch():
    assert tweaks.missing() == [], "torch moved what these tweaks patch:\n" + "\n".join(tweaks.missing())


def test_every_tweak_enters_through_a_function_that_exists():
    for tweak in tweaks.TWEAKS:
        assert callable(tweak.function()), tweak.name


def test_a_name_deleted_on_a_fake_module_is_listed(monkeypatch):
    fake = types.ModuleType("fake_inductor")
    fake.Kernel = type("Kernel", (), {"render": lambda self: None, "load": lambda self: None})
    monkeypatch.setitem(sys.modules, "fake_inductor", fake)
    tweak = tweaks.Tweak("fake", ("fake_inductor:Kernel.render", "fake_inductor:Kernel.load"), "never", "x:y")
    assert tweaks.missing((tweak,)) == []
    delattr(fake.Kernel, "load")
    assert tweaks.missing((tweak,)) == ["fake_inductor:Kernel.load (fake)"]
    monkeypatch.delitem(sys.modules, "fake_inductor")
    assert tweaks.missing((tweak,)) == ["fake_inductor:Kernel.render (fake)", "fake_inductor:Kernel.load (fake)"]


def test_a_tweak_whose_names_moved_is_skipped_with_one_warning(monkeypatch):
    moved = tweaks.Tweak("moved", ("torch._inductor:no_such_name_anywhere",), "in this test", "x:y")
    monkeypatch.setitem(tweaks.BY_NAME, "moved", moved)
    monkeypatch.setattr(tweaks, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="no torch._inductor:no_such_name_anywhere; the compile runs without"):
        with tweaks.context("moved", absent=[]) as value:
            assert value == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tweaks.context("moved"):
            pass  # warned once


def test_docs_list_every_tweak_with_the_names_it_touches():
    from pathlib import Path

    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in api.splitlines() if line.startswith("| ")}
    for tweak in tweaks.TWEAKS:
        assert tweak.name in rows, f"docs/api.md lists no tweak {tweak.name!r}"
        assert all(f"`{name}`" in rows[tweak.name] for name in tweak.touches), tweak.name
