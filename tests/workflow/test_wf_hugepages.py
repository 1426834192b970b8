"""Transparent huge pages where we own the process (superkernel.hugepages): the platform checks read
the files they are given, the CLI sets PyTorch's switch before torch's first allocation (a child
process sees it and its weights land on huge pages), and SUPERKERNEL_HUGEPAGES=0 turns it off.
No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import superkernel
from superkernel import hugepages as H

SRC = os.path.dirname(os.path.dirname(os.path.abspath(superkernel.__file__)))
needs_thp = pytest.mark.skipif(not H.transparent_huge_pages_usable(), reason="transparent huge pages off or absent")


@pytest.mark.parametrize("text, usable", [("always madvise [never]\n", False), ("[always] madvise never\n", True),
                                          ("always [madvise] never\n", True), ("", False)])
def test_thp_mode_is_read_from_the_file(tmp_path, text, usable):
    f = tmp_path / "enabled"
    f.write_text(text)
    assert H.transparent_huge_pages_usable(str(f)) is usable
    assert H.transparent_huge_pages_usable(str(tmp_path / "absent")) is False


def test_memory_reads_smaps_rollup(tmp_path):
    f = tmp_path / "smaps_rollup"
    f.write_text("Rss: 100 kB\nAnonymous:   4096 kB\nAnonHugePages:  2048 kB\n")
    assert H.memory(str(f)) == {"anon_kb": 4096, "anon_huge_kb": 2048}
    f.write_text("Rss: 100 kB\n")
    assert H.memory(str(f)) is None
    assert H.memory(str(tmp_path / "absent")) is None


def test_switches_and_opt_out_in_an_environment():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert H.with_tunable(env)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + H.TUNABLE
    assert H.with_tunable(H.with_tunable({}))["GLIBC_TUNABLES"] == H.TUNABLE  # never twice
    assert H.torch_switch_set({H.TORCH_SWITCH: "1"}) and not H.torch_switch_set({})
    assert H.enable_for_this_process({H.OPT_OUT: "0"}) == "opted out"
    assert H.enable_for_this_process({H.TORCH_SWITCH: "1"}) == "already on"
    env = {}
    # this test process imported torch long ago: too late to change the allocator here
    assert H.enable_for_this_process(env) in ("too late", "unsupported") and H.TORCH_SWITCH not in env


def _child(code: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (H.TORCH_SWITCH, H.OPT_OUT, "GLIBC_TUNABLES")}
    env.update(extra, PYTHONPATH=os.pathsep.join(x for x in (SRC, env.get("PYTHONPATH", "")) if x))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# The CLI's main() with --help exits before any work; what it left in os.environ is what torch sees next.
CLI_THEN_ALLOCATE = """
import json, os, sys
import superkernel
from superkernel import hugepages
from superkernel.tools import cli
try:
    cli.main(["--help"])
except SystemExit:
    pass
import torch
x = torch.ones(64 << 20)  # 256 MB
print(json.dumps({"switch": os.environ.get("THP_MEM_ALLOC_ENABLE"), "memory": hugepages.memory(),
                  "superkernel": os.path.abspath(superkernel.__file__)}))
"""


@needs_thp
def test_cli_puts_the_weights_on_huge_pages_and_the_opt_out_keeps_4k_pages():
    on = _child(CLI_THEN_ALLOCATE)
    assert on["superkernel"] == os.path.abspath(superkernel.__file__)  # this worktree's package
    assert on["switch"] == "1"
    off = _child(CLI_THEN_ALLOCATE, **{H.OPT_OUT: "0"})
    assert off["switch"] is None
    assert off["memory"]["anon_huge_kb"] < 64 << 10  # the 256 MB tensor is not on huge pages
    # madvise is a request: the kernel may find no free 2 MB page, so only a majority is asserted
    assert on["memory"]["anon_huge_kb"] >= 128 << 10


def test_large_regions_reads_smaps(tmp_path):
    f = tmp_path / "smaps"
    f.write_text("7f00-7f10 rw-p 00000000 00:00 0 \nRss:  131072 kB\nAnonHugePages:  129024 kB\n"
                 "7f20-7f30 rw-p 00000000 08:01 12 /tmp/model.safetensors\nRss:  262144 kB\nAnonHugePages:  0 kB\n"
                 "5500-5600 rw-p 00000000 00:00 0  [heap]\nRss:  100000 kB\nAnonHugePages:  0 kB\n"
                 "7f40-7f50 rw-p 00000000 00:00 0 \nRss:  4 kB\nAnonHugePages:  0 kB\n")
    assert H.large_regions(64, str(f)) == [{"rss_kb": 131072, "anon_huge_kb": 129024},
                                           {"rss_kb": 100000, "anon_huge_kb": 0}]  # file mappings and small ones left out
    assert H.large_regions(64, str(tmp_path / "absent")) == []
