"""Hand-made eval shards of unequal size: the last per-batch all_reduce has no partner.

Cause: uneven-eval-batches.  Run: torchrun --nproc-per-node 4 repro.py

The validation set (49 samples) is split with ``val_set[rank::world]`` instead of a
DistributedSampler, so rank 0 gets 13 samples (4 batches of 4) and ranks 1-3 get 12
(3 batches). Each eval batch averages its loss across ranks for the progress log;
rank 0's fourth all_reduce waits for ranks that already left evaluation for the
barrier. Everything hangs until the process-group timeout (REPRO_TIMEOUT_S).
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
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = synthetic_dataset(256, seed=0), synthetic_dataset(49, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
    # BUG: a hand-made shard; 49 samples do not split evenly over 4 ranks
    val_shard = Subset(val_set, range(rank, len(val_set), world))
    val_loader = DataLoader(val_shard, batch_size=4)

    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()
    val_loss = validate(model, val_loader)
    dist.barrier()
    if rank == 0:
        print(f"val loss {val_loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
