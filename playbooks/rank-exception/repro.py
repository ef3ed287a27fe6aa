"""A caught exception on one rank skips that batch's all_reduce on that rank only.

Cause: rank-exception.  Run: torchrun --nproc-per-node 2 repro.py

The eval loop wraps each step in try/except so one bad sample does not kill a
long run. A corrupt sample sits in rank 1's shard: rank 1 logs the error and
goes on, one per-batch all_reduce short. Its later all_reduces pair silently
with rank 0's earlier ones; at the end rank 0 waits in its last all_reduce while
rank 1 waits in the barrier, until the process-group timeout (REPRO_TIMEOUT_S).
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
    losses = []
    with torch.no_grad():
        for step, (features, labels) in enumerate(val_loader):
            try:
                loss = eval_step(model, features, labels)
                dist.all_reduce(loss)  # mean over ranks, for the log
                losses.append(loss.item() / world)
            except ValueError as exc:  # BUG: this rank skips the all_reduce above
                print(f"rank {rank}: skipping val step {step}: {exc}", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"val loss {sum(losses) / len(losses):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
