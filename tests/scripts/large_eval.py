"""A validation set of SAMPLES samples (20,000 by default) with a per-batch all_reduce:
preflight runs its last --eval-batches batches, whatever SAMPLES is. UNEVEN=1 splits it
by hand, the remainder to rank 0: rank 0's last batch has no partner."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    samples = int(os.environ.get("SAMPLES", "20000"))
    val_set = TensorDataset(torch.randn(samples, 4))
    if os.environ.get("UNEVEN") == "1":
        per_rank = samples // world
        extra = samples % world if rank == 0 else 0
        shard = Subset(val_set, range(rank * per_rank, (rank + 1) * per_rank + extra))
        val_loader = DataLoader(shard, batch_size=4)
    else:
        val_loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))
    model = torch.nn.Linear(4, 1).eval()
    with torch.no_grad():
        for (features,) in val_loader:
            loss = model(features).mean()
            dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
