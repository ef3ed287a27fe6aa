"""Only rank 0 evaluates, and evaluation all-reduces: the ranks never meet again.

Cause: rank-conditional-collective.  Run: torchrun --nproc-per-node 2 repro.py

Training is fine: every rank runs the same DDP steps. After the first epoch rank 0
enters evaluate(), whose all_reduce waits for rank 1; rank 1 skipped evaluation
and waits in the barrier instead. Both hang until the process-group timeout
(REPRO_TIMEOUT_S, 30 minutes by default as for gloo; NCCL's is 10).
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


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    totals = torch.zeros(2)  # summed loss, samples
    with torch.no_grad():
        for features, labels in loader:
            loss = F.cross_entropy(model(features), labels, reduction="sum")
            totals += torch.stack([loss, torch.tensor(float(len(labels)))])
    dist.all_reduce(totals)  # the mean over every rank's shard
    model.train()
    return (totals[0] / totals[1]).item()


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = synthetic_dataset(256, seed=0), synthetic_dataset(64, seed=1)
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))

    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        if rank == 0:  # BUG: evaluate() all-reduces, and only rank 0 calls it
            val_loss = evaluate(model, val_loader)
            print(f"epoch {epoch}: val loss {val_loss:.4f}", flush=True)
        dist.barrier()  # every rank finishes the epoch together
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
