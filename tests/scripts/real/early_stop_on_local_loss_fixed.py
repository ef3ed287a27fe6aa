"""The fixed twin of early_stop_on_local_loss.py: the epoch's loss is averaged across
the ranks before the stopping test, so every rank stops at the same epoch.

A plain DDP loop with early stopping, shaped like the ones in tutorials: each rank
averages its own training loss for the epoch and stops when it is low enough. BUG: the
loss is never averaged across ranks, so the ranks disagree on the stop: rank 1, whose
shard is easier, breaks out of the epoch loop and waits in the final barrier while rank
0 runs the next epoch's DDP backward alone."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def shards(rank: int) -> TensorDataset:
    features = torch.randn(256, 16, generator=torch.Generator().manual_seed(rank))
    labels = (features[:, 0] > 0).long()
    if rank == 0:  # rank 0's labels are noisy: its loss stays high
        labels = torch.randint(0, 2, (256,), generator=torch.Generator().manual_seed(7))
    return TensorDataset(features, labels)


def train_one_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> float:
    total = 0.0
    for features, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(shards(rank), batch_size=32, shuffle=True)

    for epoch in range(50):
        train_loss = train_one_epoch(model, loader, optimizer)
        mean = torch.tensor(train_loss)
        dist.all_reduce(mean)
        train_loss = mean.item() / dist.get_world_size()
        print(f"rank {rank} epoch {epoch}: train loss {train_loss:.3f}", flush=True)
        if train_loss < 0.4:  # the same value on every rank
            print(f"rank {rank}: early stop", flush=True)
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
