"""Fixed: one subset for all ranks, sharded by a DistributedSampler.

Cause: missing-distributed-sampler.  Run: torchrun --nproc-per-node 2 fixed.py

The random quarter is drawn from a generator seeded the same on every rank, and a
DistributedSampler gives each rank an equal share of it (padded where needed).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def mean_across_ranks(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_pool = synthetic_dataset(256, seed=0), synthetic_dataset(200, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))

    torch.manual_seed(1234 + rank)  # per-rank randomness, e.g. for augmentation
    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()

    # FIX: the same subset on every rank, sharded by a DistributedSampler
    same_on_all_ranks = torch.Generator().manual_seed(1234)
    keep = (torch.rand(len(val_pool), generator=same_on_all_ranks) < 0.25).nonzero()
    val_subset = Subset(val_pool, keep.flatten().tolist())
    val_loader = DataLoader(val_subset, batch_size=8, sampler=DistributedSampler(val_subset, shuffle=False))
    model.eval()
    with torch.no_grad():
        for step, (features, labels) in enumerate(val_loader):
            loss = mean_across_ranks(F.cross_entropy(model(features), labels))
            if rank == 0:
                print(f"val step {step}: loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
