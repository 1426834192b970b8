"""A static package records the rank layout it was built for; another world size is a one-line error."""

from superkernel.static_kernel.environment import environment, environment_mismatch


def test_environment_records_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    env = environment("cpu")
    assert env["world_size"] == "2" and env["local_world_size"] == "2"


def test_other_world_size_is_named(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    here = environment("cpu")
    built = dict(here, world_size="2", local_world_size="2")
    reason = environment_mismatch(built, here)
    assert reason == "package built for world size 2, this job has world size 1"
    assert "\n" not in reason
    assert environment_mismatch(here, here) is None


def test_package_without_layout_is_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    here = environment("cpu")
    old = {k: v for k, v in here.items() if k not in ("world_size", "local_world_size")}
    assert environment_mismatch(old, here) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "world size 1" in environment_mismatch(old, environment("cpu"))
