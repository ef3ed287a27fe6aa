"""Fixed: every rank runs backward on every step; a bad loss is zeroed, not skipped.

Cause: data-dependent-branch.  Run: torchrun --nproc-per-node 2 fixed.py

The non-finite loss is replaced by a zero loss that still flows through the model
(zero gradients), so every rank issues the same gradient all_reduces; the step is
skipped on every rank together by agreeing on it first.
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
        features[corrupt_index, 0] = float("inf")  # a corrupt record
    return TensorDataset(features, labels)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0, corrupt_index=101)  # odd index: rank 1's shard
    val_set = synthetic_dataset(64, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set, shuffle=False))
    val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))

    for step, (features, labels) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        finite = torch.isfinite(loss).float()
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # FIX: all ranks agree on the skip
        if not torch.isfinite(loss):
            loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0  # keeps the graph: zero gradients
        loss.backward()  # DDP all-reduces the gradients on every rank, every step
        if finite.item() == 1.0:
            optimizer.step()
        elif rank == 0:
            print(f"step {step}: a rank had a non-finite loss, skipped on all ranks", flush=True)

    model.eval()
    totals = torch.zeros(2)
    with torch.no_grad():
        for features, labels in val_loader:
            batch_loss = F.cross_entropy(model(features), labels, reduction="sum")
            totals += torch.stack([batch_loss, torch.tensor(float(len(labels)))])
    dist.all_reduce(totals)
    if rank == 0:
        print(f"val loss {(totals[0] / totals[1]).item():.4f}", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
