"""A script written for the legacy launcher (`python -m torch.distributed.launch
--nproc_per_node=2 train.py`), as many older repositories are: it takes its rank from
the --local_rank argument that launcher passes, and validates on local rank 0 only,
where the validation all-reduces. FIXED=1 validates on every rank."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.local_rank == 0 or os.environ.get("FIXED") == "1":
        with torch.no_grad():
            val_loss = model(torch.randn(8, 4)).pow(2).mean()
        dist.all_reduce(val_loss)
        print(f"val loss {val_loss.item() / dist.get_world_size():.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
