"""Fixed: a DistributedSampler gives every rank the same number of eval batches.

Cause: uneven-eval-batches.  Run: torchrun --nproc-per-node 4 fixed.py

DistributedSampler pads the 49 samples to 52 by repeating a few, so every rank
draws 13 samples in 4 batches and every per-batch all_reduce has its partners.
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


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def mean_across_ranks(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for step, (features, labels) in enumerate(loader):
            loss = mean_across_ranks(F.cross_entropy(model(features), labels))
            losses.append(loss.item())
            if dist.get_rank() == 0:
                print(f"  val step {step}: loss {loss.item():.4f}", flush=True)
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = synthetic_dataset(256, seed=0), synthetic_dataset(49, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
    # FIX: DistributedSampler pads the shards to equal length
    val_loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))

    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()
    val_loss = validate(model, val_loader)
    dist.barrier()
    if rank == 0:
        print(f"val loss {val_loss:.4f}", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
