"""Fixed: pad to the longest rank's length, gather, then trim (pad_across_processes).

Cause: collective-shape-mismatch.  Run: torchrun --nproc-per-node 2 fixed.py

The ranks first agree on the longest length (an all_reduce of one number), pad
their tensor to it, gather, and drop the padding with the gathered lengths.
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
    return TensorDataset(features, labels, torch.arange(samples))


def flagged_samples(model: nn.Module, loader: DataLoader) -> torch.Tensor:
    model.eval()
    flagged = []
    with torch.no_grad():
        for features, _labels, index in loader:
            flagged.append(index[model(features).argmax(dim=1) == 1])
    model.train()
    return torch.cat(flagged)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = synthetic_dataset(256, seed=0), synthetic_dataset(64, seed=1)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))

    for features, labels, _index in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()

    mine = flagged_samples(model, val_loader)
    print(f"rank {rank}: {len(mine)} flagged samples", flush=True)
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(mine)]))  # FIX: agree on the shape first
    longest = int(max(length.item() for length in lengths))
    padded = F.pad(mine, (0, longest - len(mine)), value=-1)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    flagged = torch.cat([g[: int(n.item())] for g, n in zip(gathered, lengths, strict=True)])
    if rank == 0:
        print(f"{len(flagged)} flagged samples in all", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
