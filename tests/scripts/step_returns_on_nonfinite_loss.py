"""A step function that gives up on a non-finite loss before its backward: on the rank
whose batch holds a NaN, DDP's gradient all-reduce of that step is never made."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float | None:
    loss = F.mse_loss(model(x), y)
    if not torch.isfinite(loss):
        return None  # a corrupt batch: keep the optimizer state clean
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss)


def main() -> None:
    dist.init_process_group("gloo")
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 4), torch.randn(32, 1)
    inputs[20] = float("nan")  # in rank 0's shard (sample 20 of an unshuffled split)
    data = TensorDataset(inputs, targets)
    for x, y in DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False)):
        train_step(model, optimizer, x, y)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
