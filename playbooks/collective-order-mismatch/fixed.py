"""Fixed: metrics are reduced in one fixed order (sorted by name) on every rank.

Cause: collective-order-mismatch.  Run: torchrun --nproc-per-node 2 fixed.py
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


def sync_metrics(metrics: dict[str, tuple[torch.Tensor, dist.ProcessGroup | None]]) -> dict[str, float]:
    totals = {}
    for name in sorted(metrics):  # FIX: the same order on every rank
        value, group = metrics[name]
        dist.all_reduce(value, group=group)
        totals[name] = value.item()
    return totals


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    metrics_group = dist.new_group(backend="gloo", timeout=timeout)
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))

    metrics: dict[str, tuple[torch.Tensor, dist.ProcessGroup | None]] = {}
    if local_rank == 0:  # the node leader also reports throughput, and first
        metrics["samples"] = (torch.zeros(1), None)
    loss_sum = torch.zeros(1)
    metrics["loss_sum"] = (loss_sum, metrics_group)
    metrics.setdefault("samples", (torch.zeros(1), None))
    for features, labels in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * len(labels)
        metrics["samples"][0].add_(len(labels))
    totals = sync_metrics(metrics)
    if rank == 0:
        total, samples = totals["loss_sum"], totals["samples"]
        print(f"train loss {total / samples:.4f} over {samples:.0f} samples", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
