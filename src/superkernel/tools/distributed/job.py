"""One rank's side of a job: join the process group, exchange small results between ranks.

Results travel as JSON and tensors as safetensors bytes (never pickle), through a
gloo group: ``torch.distributed``'s ``*_object`` helpers would unpickle what peers send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from superkernel.tools.distributed.launcher import RankEnv, rank_env, start_heartbeat

#: A collective of the decode step that waits longer than this raises on that rank (which
#: ends the job); long enough for one rank compiling a plan while its peers wait.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
#: The hand-over of the single-process reference: peers wait for rank 0's whole 1-process run.
HANDOFF_TIMEOUT = timedelta(hours=2)


@dataclass
class Job:
    env: RankEnv
    device: torch.device
    backend: str
    handoff: Any          # gloo group with a long timeout, for results and the reference

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0


def join(device: torch.device) -> Job:
    """Initialize torch.distributed from the environment: gloo on CPU, NCCL on CUDA."""
    env = rank_env()
    start_heartbeat()
    if device.type == "cuda":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    handoff = dist.new_group(backend="gloo", timeout=HANDOFF_TIMEOUT)
    return Job(env=env, device=device, backend=backend, handoff=handoff)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_bytes(data: bytes | None, job: Job, src: int = 0) -> bytes:
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src, group=job.handoff)
    buf = torch.empty(int(size), dtype=torch.uint8)
    if job.rank == src and len(buf):
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src, group=job.handoff)
    return bytes(buf.numpy().tobytes())


def broadcast_json(obj: Any, job: Job, src: int = 0) -> Any:
    data = json.dumps(obj).encode() if job.rank == src else None
    return json.loads(broadcast_bytes(data, job, src).decode())


def gather_json(obj: Any, job: Job) -> list[Any]:
    """Every rank's ``obj`` on every rank, in rank order."""
    data = json.dumps(obj).encode()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(job.world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=job.handoff)
    longest = max(int(s) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    if data:
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(job.world_size)]
    dist.all_gather(bufs, mine, group=job.handoff)
    return [json.loads(bytes(b[:int(s)].numpy().tobytes()).decode()) for b, s in zip(bufs, sizes)]


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous().cpu() for k, v in tensors.items()})


def tensors_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(data)
