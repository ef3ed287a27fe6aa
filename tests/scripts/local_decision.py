"""Decisions on values no rank shares with the others, which a dry run on identical data
does not show unless they are made to differ (preflight --perturb). MODE:

- early_stop: every rank evaluates the same data and stops training when its own
  validation loss stops improving; nothing synchronises the decision
- clock: every rank stops training when its own clock passes a one-hour budget
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for features, labels in loader:
            total += F.cross_entropy(model(features), labels).item()
    model.train()
    return total / len(loader)


def setup() -> tuple[nn.Module, torch.optim.Optimizer, DataLoader, DataLoader]:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(256, 8, generator=generator), torch.randint(0, 2, (256,), generator=generator)
    )
    train = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    val = DataLoader(data, batch_size=64)  # the same samples on every rank
    return model, optimizer, train, val


def step(
    model: nn.Module, optimizer: torch.optim.Optimizer, features: torch.Tensor, labels: torch.Tensor
) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(features), labels).backward()
    optimizer.step()


def early_stop() -> None:
    model, optimizer, train, val = setup()
    best, patience = float("inf"), 0
    for _epoch in range(8):
        for features, labels in train:
            step(model, optimizer, features, labels)
        loss = validate(model, val)
        if loss < best:
            best, patience = loss, 0
        else:
            patience += 1
        if patience >= 1:
            break  # this rank's own loss: the others may train on


def clock() -> None:
    model, optimizer, train, _val = setup()
    start = time.time()
    for _epoch in range(8):
        for features, labels in train:
            step(model, optimizer, features, labels)
            if time.time() - start > 3600:
                break  # this rank's budget, read from this rank's clock


def main() -> None:
    early_stop() if os.environ.get("MODE", "early_stop") == "early_stop" else clock()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
