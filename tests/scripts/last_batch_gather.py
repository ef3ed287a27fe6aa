"""Train accuracy gathered from every rank each step, as people log it: all_gather of the
step's predictions. The shards are split by hand (every world-th sample), so the ranks
have as many batches but the last one holds 3 samples on rank 0 and 2 on rank 1: the
epoch's last all_gather is called with two shapes. MODE=fixed: the count is gathered first
and the predictions padded to the largest, as all_gather needs."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, TensorDataset

SAMPLES = 8 * 400 + 5  # 400 full batches of 8 over two ranks, and 5 left over


def gathered_predictions(predictions: torch.Tensor, world: int) -> torch.Tensor:
    if os.environ.get("MODE") != "fixed":
        parts = [torch.empty_like(predictions) for _ in range(world)]
        dist.all_gather(parts, predictions)
        return torch.cat(parts)
    count = torch.tensor([predictions.shape[0]])
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    largest = int(max(c.item() for c in counts))
    padded = torch.zeros(largest, *predictions.shape[1:])
    padded[: predictions.shape[0]] = predictions
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(c.item())] for p, c in zip(parts, counts, strict=True)])


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, 4), torch.randint(0, 2, (SAMPLES,)))
    shard = Subset(data, list(range(rank, SAMPLES, world)))
    loader = DataLoader(shard, batch_size=4, shuffle=True)
    model = DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (features, labels) in enumerate(loader):
        logits = model(features)
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        everyone = gathered_predictions(logits.argmax(dim=1), world)
        if rank == 0 and step % 100 == 0:
            print(f"step {step}: {everyone.numel()} predictions gathered", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
