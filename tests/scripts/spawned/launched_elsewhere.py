"""Ranks started by a helper module's mp.spawn; rank 1 skips the barrier's partner call
(a rank test around the all_reduce), the classic rank-conditional collective."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from spawn_helper import launch


def worker(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("TUTORIAL_PORT", "29534")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    value = torch.ones(1)
    if rank == 0:
        dist.all_reduce(value)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(worker, 2)
