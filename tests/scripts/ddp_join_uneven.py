"""Train shards of different lengths (rank 0: 5 batches, rank 1: 3) under DDP's Join
context manager, the documented way to train on uneven inputs: the ranks out of
batches make stand-ins for DDP's collectives from the ``with`` line.

MODE=join (the default): aligned by design.
MODE=log_loss: the loop also all-reduces each step's loss for the log, a collective
Join has no stand-in for: the ranks still training wait in it (gloo aborts on the
size mismatch with the stand-in it meets).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MODE = os.environ.get("MODE", "join")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    shard = TensorDataset(torch.randn(8 * (5 if rank == 0 else 3), 4))  # each rank's own files
    train_loader = DataLoader(shard, batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model]):
        for (x,) in train_loader:
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if MODE == "log_loss":
                logged = loss.detach().clone()
                dist.all_reduce(logged)

    model.eval()
    val_set = TensorDataset(torch.randn(32, 4))
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))
    total = torch.zeros(1)
    with torch.no_grad():
        for (x,) in val_loader:
            total += model.module(x).sum()
    dist.all_reduce(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
