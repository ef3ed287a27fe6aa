"""Validation split by hand (every world-th sample), the way many scripts shard an eval
set: 10,000 samples divide evenly over 2, 4 or 8 ranks, so a dry run on the CI
machine is aligned; over 48 ranks the first 16 hold 209 samples and the others 208,
with batches of 16 that is 14 batches against 13, and ranks 0-15 wait in an
all_reduce the others never make (uneven-eval-batches at the production size).

VAL_SAMPLES=40 makes it the other production-only bug: more ranks than samples. Over
2 ranks 20 each; over 64 ranks, ranks 0-39 hold one sample and ranks 40-63 none, so
their eval loop makes no all_reduce at all.

MODE=fixed shards with DistributedSampler (padded to equal length on every world).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    train_loader = DataLoader(train, batch_size=8, sampler=DistributedSampler(train))
    samples = int(os.environ.get("VAL_SAMPLES", "10000"))
    val = TensorDataset(torch.randn(samples, 8), torch.randint(0, 2, (samples,)))
    if os.environ.get("MODE") == "fixed":
        val_loader = DataLoader(val, batch_size=16, sampler=DistributedSampler(val, shuffle=False))
    else:
        val_loader = DataLoader(Subset(val, range(rank, len(val), world)), batch_size=16)  # BUG

    for _epoch in range(2):
        model.train()
        for features, labels in train_loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(features), labels).backward()
            optimizer.step()
        model.eval()
        total = torch.zeros(2)
        with torch.no_grad():
            for features, labels in val_loader:
                loss = nn.functional.cross_entropy(model(features), labels, reduction="sum")
                batch = torch.stack([loss, torch.tensor(float(len(labels)))])
                dist.all_reduce(batch)
                total += batch
        if rank == 0:
            print(f"val loss {float(total[0] / total[1]):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
