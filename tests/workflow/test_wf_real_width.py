"""benchmarks/real_width.py's small parts: the roofline's bandwidth and the checkpoint writer's refusals."""

from __future__ import annotations

from tests._benchmarks import load_benchmark


def _bench():
    return load_benchmark("real_width")


def test_best_bandwidth_keeps_the_fastest_read_per_kernel():
    rw = _bench()
    busy = {"read": 9.0, "copy": 7.0, "reads": {"sum": 9.0, "W @ x": 8.0}}
    quiet = {"read": 20.0, "copy": 5.0, "reads": {"sum": 4.0, "W @ x": 20.0}}
    best = rw.best_bandwidth(busy, quiet)
    assert best == {"read": 20.0, "copy": 7.0, "reads": {"sum": 9.0, "W @ x": 20.0}}


def test_save_checkpoint_refuses_an_existing_directory_and_a_bad_dtype(tmp_path, capsys):
    rw = _bench()
    existing = tmp_path / "ckpt"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert rw.main(["--save-checkpoint", str(existing)]) == 2
    assert "exists" in capsys.readouterr().err
    assert (existing / "keep.txt").read_text() == "mine"  # never overwritten
    assert rw.main(["--save-checkpoint", str(tmp_path / "new"), "--dtypes", "int8"]) == 2
    assert "allowed float32, bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_each_page_setting_gets_only_its_own_switch():
    hp = load_benchmark("studies/real_width_hugepages")
    parent = {"THP_MEM_ALLOC_ENABLE": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "HOME": "/h"}
    four_k = hp.setting_env("4k", parent)
    assert four_k == {"HOME": "/h", "SUPERKERNEL_HUGEPAGES": "0"}
    assert hp.setting_env("thp-torch", parent) == {"HOME": "/h", "THP_MEM_ALLOC_ENABLE": "1"}
    glibc = hp.setting_env("thp-glibc", parent)
    assert glibc["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and "THP_MEM_ALLOC_ENABLE" not in glibc
    assert glibc["SUPERKERNEL_HUGEPAGES"] == "0"  # real_width.py must not add the torch switch


def test_pages_line_names_the_regions_left_on_4k_pages():
    rw = _bench()
    line = rw._pages_line({"anon_kb": 4 << 20, "anon_huge_kb": 3 << 20},
                          [{"rss_kb": 600 << 10, "anon_huge_kb": 0}, {"rss_kb": 1 << 20, "anon_huge_kb": 1 << 20}])
    assert "4096 MB, 3072 MB of it on transparent huge pages (75%)" in line
    assert "regions of 64 MB or more: 2, of which on 4 KiB pages (MB): 600." in line
    assert rw._pages_line(None) == "Huge pages: not reported by this kernel."
