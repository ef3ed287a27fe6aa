"""A Lightning Fabric loop shaped like Fabric's image-classifier example, launched with
torchrun (Fabric's DDP strategy on CPU, gloo). BUG: a step whose loss is not finite is
skipped with `continue` before fabric.backward(loss); one corrupt record in rank 1's
shard makes rank 1 skip one gradient all-reduce, and from there the ranks are a step
apart: at the end rank 0 waits in its last backward while rank 1 waits in the barrier
after the loop."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def corrupt_dataset(samples: int) -> TensorDataset:
    features = torch.randn(samples, 16, generator=torch.Generator().manual_seed(0))
    features[37, 3] = float("inf")  # odd index: lands in rank 1's shard
    return TensorDataset(features, (features[:, :4].sum(dim=1) > 0).long())


def main() -> None:
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
    fabric.launch()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(corrupt_dataset(128), batch_size=8, shuffle=False))

    for epoch in range(2):
        for batch_index, (features, labels) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(features), labels)
            if not torch.isfinite(loss):  # BUG: only the rank with the bad record skips
                fabric.print(f"skipping batch {batch_index}: loss {loss.item()}")
                continue
            fabric.backward(loss)
            optimizer.step()
        fabric.barrier()
        fabric.print(f"epoch {epoch} done")


if __name__ == "__main__":
    main()
