"""Fixed: the eval batch is sized for the smallest rank's memory.

Cause: rank-crashed.  Run: torchrun --nproc-per-node 2 fixed.py

The eval batch equals the training batch, which fits every rank's budget, so no
rank is killed and every rank reaches the all_reduce.
"""

from __future__ import annotations

import datetime
import os
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EVAL_BATCH_SIZE = 16  # FIX: fits the smallest rank's memory


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def memory_budget_bytes(rank: int) -> int:
    return 2048 if rank == 1 else 1 << 20  # rank 1's device is shared with another job


def forward_within_budget(model: nn.Module, features: torch.Tensor, rank: int) -> torch.Tensor:
    activation_bytes = features.shape[0] * 32 * 4  # the hidden layer, float32
    if activation_bytes > memory_budget_bytes(rank):
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    return model(features)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = synthetic_dataset(256, seed=0), synthetic_dataset(256, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(
        val_set, batch_size=EVAL_BATCH_SIZE, sampler=DistributedSampler(val_set, shuffle=False)
    )

    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(forward_within_budget(model, features, rank), labels).backward()
        optimizer.step()

    model.eval()
    totals = torch.zeros(2)
    with torch.no_grad():
        for features, labels in val_loader:
            logits = forward_within_budget(model, features, rank)
            loss = F.cross_entropy(logits, labels, reduction="sum")
            totals += torch.stack([loss, torch.tensor(float(len(labels)))])
    dist.all_reduce(totals)
    if rank == 0:
        print(f"val loss {(totals[0] / totals[1]).item():.4f}", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
