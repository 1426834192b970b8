"""The ISA probe store: a build keeps TorchInductor's CPU-ISA probes once, later builds start from a copy,
and nothing in the store that this user's key does not vouch for is ever copied into a build. (A real build
keeping and carrying them: test_build_and_load.py.)"""

from __future__ import annotations

import os

import pytest

from superkernel.static_kernel import isa_probes


PROBE = b'#include <ATen/cpu/vec/vec.h>\nextern "C" void __avx_chk_kernel() {}\n'
KERNEL = b'extern "C" void kernel(float* out) {}\n'


def _cache(root, files):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "skcache"))
    return tmp_path / "skcache" / "isa_probes"


def test_a_build_keeps_its_probes_and_the_next_one_starts_from_them(tmp_path, store):
    probe, lib, other = "ab/c" + "a" * 51 + ".cpp", "ab/c" + "a" * 51 + ".so", "cd/c" + "b" * 51
    first = _cache(tmp_path / "first", {probe: PROBE, lib: b"ELF probe", other + ".cpp": KERNEL, other + ".so": b"ELF k"})
    assert isa_probes.probes(first) == [probe, lib]  # a kernel is not a probe
    assert isa_probes.keep(first) == 2 and isa_probes.keep(first) == 0  # once
    assert sorted(p.name for p in (store / "ab").iterdir()) == sorted([probe[3:], probe[3:] + ".sig", lib[3:],
                                                                      lib[3:] + ".sig"])
    second = tmp_path / "second"
    second.mkdir()
    assert isa_probes.seed(second) == 2
    assert (second / lib).read_bytes() == b"ELF probe" and (second / probe).read_bytes() == PROBE
    assert isa_probes.seed(second) == 0  # what a build has stays


@pytest.mark.parametrize("how", ["changed", "unsigned", "planted"])
def test_a_file_the_key_does_not_vouch_for_is_never_copied(tmp_path, store, how):
    probe, lib = "ab/c" + "a" * 51 + ".cpp", "ab/c" + "a" * 51 + ".so"
    isa_probes.keep(_cache(tmp_path / "first", {probe: PROBE, lib: b"ELF probe"}))
    if how == "changed":  # rewritten after it was kept
        (store / lib).write_bytes(b"ELF something else")
    elif how == "unsigned":
        os.unlink(store / (lib + ".sig"))
    else:  # a pair that never went through keep
        _cache(store, {"ef/c" + "e" * 51 + ".cpp": PROBE, "ef/c" + "e" * 51 + ".so": b"ELF planted"})
    build = tmp_path / "build"
    build.mkdir()
    copied = isa_probes.seed(build)
    assert not (build / "ef").exists()
    assert (build / lib).exists() == (how == "planted") and copied == (2 if how == "planted" else 1)
