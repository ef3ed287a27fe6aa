"""A script that starts its ranks itself with torch.multiprocessing.spawn, as many
single-node scripts do; under preflight every torchrun rank would start two more."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    value = torch.ones(1)
    dist.all_reduce(value)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
