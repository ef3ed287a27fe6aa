"""Early stopping decided on each rank from its own validation loss.

Cause: unsynchronized-decision.  Run: torchrun --nproc-per-node 2 repro.py

Training stops as soon as the validation loss reaches a target. Each rank
evaluates its DistributedSampler shard and compares its *local* loss with the
target. The shards differ (rank 1's half of the validation set comes from a
shifted distribution): after the first epoch rank 0's loss (0.68) is below the
target and rank 1's (0.79) is not. Rank 0 leaves the loop for the final barrier,
rank 1 enters the next epoch's gradient all_reduce. Both hang until the
process-group timeout (REPRO_TIMEOUT_S).
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


def local_val_loss(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for features, labels in loader:
            total += F.cross_entropy(model(features), labels, reduction="sum").item()
            count += len(labels)
    model.train()
    return total / count


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
        val_loss = local_val_loss(model, val_loader)  # BUG: this rank's shard only
        print(f"rank {rank} epoch {epoch}: val loss {val_loss:.4f}", flush=True)
        if val_loss < target_loss:
            break  # ranks disagree on when to stop
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
