"""Fixed: the failure is caught around the step, and the all_reduce runs on every rank.

Cause: rank-exception.  Run: torchrun --nproc-per-node 2 fixed.py

A rank whose step failed still joins the all_reduce, with a zero contribution and
a zero count, so the mean is over the batches that worked, on every rank.
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


def synthetic_dataset(samples: int, seed: int, corrupt_index: int | None = None) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    if corrupt_index is not None:
        features[corrupt_index] = float("nan")  # a record that failed to decode
    return TensorDataset(features, labels)


def eval_step(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if torch.isnan(features).any():
        raise ValueError("corrupt sample in batch")
    return F.cross_entropy(model(features), labels)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    val_set = synthetic_dataset(64, seed=1, corrupt_index=21)  # odd index: rank 1's shard
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))

    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()

    model.eval()
    totals = torch.zeros(2)  # summed batch losses, batches that worked
    with torch.no_grad():
        for step, (features, labels) in enumerate(val_loader):
            contribution = torch.zeros(2)
            try:
                contribution = torch.stack([eval_step(model, features, labels), torch.tensor(1.0)])
            except ValueError as exc:
                print(f"rank {rank}: skipping val step {step}: {exc}", flush=True)
            dist.all_reduce(contribution)  # FIX: outside the try, on every rank
            totals += contribution
    dist.barrier()
    if rank == 0:
        print(f"val loss {(totals[0] / totals[1]).item():.4f} over {world} ranks", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
