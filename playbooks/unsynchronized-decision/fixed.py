"""Fixed: the early-stopping rule reads the loss averaged over every rank.

Cause: unsynchronized-decision.  Run: torchrun --nproc-per-node 2 fixed.py

The summed loss and count are all-reduced before the decision, so every rank sees
the same number and stops (or not) at the same epoch.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_dataset(samples: int, seed: int, shifted_every_other: bool = False) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    if shifted_every_other:  # odd samples (rank 1's shard) follow the opposite rule
        labels[1::2] = 1 - labels[1::2]
    return TensorDataset(features, labels)


def global_val_loss(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    totals = torch.zeros(2)  # summed loss, samples
    with torch.no_grad():
        for features, labels in loader:
            loss = F.cross_entropy(model(features), labels, reduction="sum")
            totals += torch.stack([loss, torch.tensor(float(len(labels)))])
    dist.all_reduce(totals)  # FIX: every rank decides on the same value
    model.train()
    return (totals[0] / totals[1]).item()


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    val_set = synthetic_dataset(64, seed=1, shifted_every_other=True)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))

    target_loss = 0.72  # good enough: stop early and save the compute
    for epoch in range(6):
        sampler.set_epoch(epoch)
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        val_loss = global_val_loss(model, val_loader)
        print(f"rank {rank} epoch {epoch}: val loss {val_loss:.4f}", flush=True)
        if val_loss < target_loss:
            break  # the same epoch on every rank
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
