"""FSDP2 (fully_shard) training that shows a prediction on a few samples after each epoch,
on rank 0 only: a sharded model's forward all-gathers its parameters from every rank, so
rank 0's preview waits for ranks that went on to the next epoch. MODE=fixed runs the
preview's forward on every rank and prints on rank 0."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def preview(model: nn.Module, samples: torch.Tensor) -> None:
    with torch.no_grad():
        predicted = model(samples).argmax(dim=1)
    if dist.get_rank() == 0:
        print(f"preview: {predicted.tolist()}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    features = torch.randn(64, 16)
    train_set = TensorDataset(features, (features.sum(dim=1) > 0).long())
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=8, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch, labels in loader:
            loss = nn.functional.cross_entropy(model(batch), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if os.environ.get("MODE") == "fixed" or dist.get_rank() == 0:
            preview(model, features[:4])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
