"""holdout_shard_patience.py's twin: each rank scores its own slice of the holdout set,
and the loss is averaged over the ranks before the stopper sees it, so every rank stops at
the same epoch."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from holdout_shard_patience import Patience, holdout_loss
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    rows, targets = torch.randn(64, 8), torch.randn(64)
    per_rank = len(rows) // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stopper = Patience(patience=3)
    for _epoch in range(30):
        for _step in range(4):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(16, 8)).squeeze(-1), torch.randn(16)).backward()
            optimizer.step()
        total = torch.tensor([holdout_loss(model.module, rows[mine], targets[mine])])
        dist.all_reduce(total)
        if stopper.should_stop(total.item() / world):
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
