"""A job started with torch.multiprocessing.spawn, as tutorials start them: no torchrun,
no RANK in the environment. Rank 0 alone all-reduces; rank 1 waits in the barrier."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("SPAWN_PORT", "29533")
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "120")))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    value = torch.ones(1)
    if rank == 0:
        dist.all_reduce(value)  # rank 0 alone
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
