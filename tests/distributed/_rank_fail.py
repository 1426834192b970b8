"""One rank for the launcher tests: ``ok`` (an all-reduce, exit 0), ``kill`` (rank 1 kills itself
while rank 0 waits in an all-reduce), ``hang`` (rank 1 stops itself), ``exit`` (rank 1 exits 3), ``sleep`` (both sleep 10 minutes)."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from superkernel.tools.distributed.launcher import start_heartbeat


def main() -> None:
    what = sys.argv[1]
    start_heartbeat()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    time.sleep(0.5)
    if rank == 1 and what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and what == "hang":
        os.kill(os.getpid(), signal.SIGSTOP)
    if what == "sleep":  # until the launcher is gone
        time.sleep(600)
    if rank == 1 and what == "exit":
        sys.stderr.write("rank 1: error: bad things\n")
        sys.exit(3)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == dist.get_world_size()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
