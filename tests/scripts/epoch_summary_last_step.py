"""An epoch summary written at the loop's last step, as many training loops do it
(``if i == len(loader) - 1:``), where only rank 0 all-reduces the epoch's loss to print
it: rank 1 goes on to the next epoch and its first DDP step meets rank 0's all_reduce.
MODE=fixed: every rank reduces, rank 0 prints."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def summarize(epoch: int, total: torch.Tensor, steps: int, rank: int, world: int) -> None:
    if os.environ.get("MODE") == "fixed":
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total.item() / (steps * world):.4f}", flush=True)
        return
    if rank == 0:
        dist.all_reduce(total)  # the others are already in their next epoch
        print(f"epoch {epoch}: mean loss {total.item() / (steps * world):.4f}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(6000, 10), torch.randn(6000, 1))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        epoch_loss = torch.zeros(1)
        for i, (features, target) in enumerate(loader):
            loss = nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach()
            if i == len(loader) - 1:  # the epoch's last step
                summarize(epoch, epoch_loss, i + 1, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
