"""The barrier-synced decode loop counts Dynamo's recompiles per phase (a 1-rank gloo group, a real decode session)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from superkernel.tools.decode import prepare
from superkernel.tools.distributed.launcher import free_port
from superkernel.tools.distributed.timing import run_synced

SCALE = 1.0


@pytest.fixture(scope="module")
def session():
    from superkernel.tools.models import load_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield prepare(load_model("llama-tiny").model, prompt_len=4, steps=3, warmup=1)
    dist.destroy_process_group()


def _scaled(ids: torch.Tensor) -> torch.Tensor:
    return ids.float() * SCALE


def test_recompiles_in_the_timed_steps_are_counted(session):
    """A step whose compiled part guards on a global that changes every step recompiles in the timed steps."""
    global SCALE
    torch._dynamo.reset()
    compiled = torch.compile(_scaled, backend="eager")

    def step(ids, pos):
        global SCALE
        SCALE += 1.0
        return compiled(ids).reshape(1, -1)

    run = run_synced(session, step)
    assert run.dynamo.recompiles_timed >= 1 and "SCALE" in run.dynamo.reasons[0]  # (a float becomes dynamic after one)


def test_a_stable_step_has_no_recompiles(session):
    torch._dynamo.reset()
    compiled = torch.compile(_scaled, backend="eager")
    run = run_synced(session, lambda ids, pos: compiled(ids).reshape(1, -1))
    assert run.dynamo.recompiles_timed == 0 and run.dynamo.recompiles_warmup == 0
