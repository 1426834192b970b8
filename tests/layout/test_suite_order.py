"""The suite's file order (tests/conftest.py): a hint that must name real files and keep each file's order."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import SLOW_FIRST, TESTS, _slow_first


def test_every_slow_first_file_exists():
    missing = [name for name in SLOW_FIRST if not (Path(TESTS) / name).is_file()]
    assert not missing, f"renamed or removed: {missing}; update SLOW_FIRST in tests/conftest.py"
    assert len(set(SLOW_FIRST)) == len(SLOW_FIRST)


def test_xdist_keeps_the_order():
    """pytest-xdist reorders files by their number of tests unless its reorder is off: SLOW_FIRST would be
    ignored. The suite's configure hook turns it off wherever xdist is loaded, and leaves other runs alone."""
    from tests.conftest import pytest_configure

    def config(xdist: bool):
        return SimpleNamespace(pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist and name == "xdist"),
                               option=SimpleNamespace(loadscopereorder=True))

    with_xdist, without = config(True), config(False)
    pytest_configure(with_xdist)
    pytest_configure(without)
    assert with_xdist.option.loadscopereorder is False and without.option.loadscopereorder is True


def test_listed_files_come_first_in_their_order_and_each_file_keeps_its_own_order():
    def item(name, i):
        return SimpleNamespace(path=Path(os.path.join(TESTS, name)), i=i)

    items = [item("other/test_a.py", 0), item(SLOW_FIRST[1], 1), item("other/test_a.py", 2),
             item(SLOW_FIRST[0], 3), item(SLOW_FIRST[1], 4), item("other/test_b.py", 5)]
    _slow_first(items)
    assert [x.i for x in items] == [3, 1, 4, 0, 2, 5]
