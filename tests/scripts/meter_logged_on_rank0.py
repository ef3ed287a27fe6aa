"""A running-average meter whose global average all-reduces, as people write it beside
torchvision's reference scripts: rank 0 logs it every 20 steps with an f-string, and
formatting the meter calls __str__, which reads the global_avg property, which
all-reduces. Rank 1 never logs, so rank 0's all_reduce meets rank 1's next DDP step.
MODE=fixed: every rank reads the global average, rank 0 prints the number."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SmoothedValue:
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, value: float) -> None:
        self.total += value
        self.count += 1

    @property
    def global_avg(self) -> float:
        both = torch.tensor([self.total, float(self.count)])
        dist.all_reduce(both)
        return float(both[0] / both[1])

    def __str__(self) -> str:
        return f"{self.global_avg:.4f}"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 8), torch.randn(2048, 1))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_meter = SmoothedValue()
    for step, (features, target) in enumerate(loader):
        loss = nn.functional.mse_loss(model(features), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_meter.update(loss.item())
        if step % 20 == 0:
            if os.environ.get("MODE") == "fixed":
                average = loss_meter.global_avg
                if rank == 0:
                    print(f"step {step}: loss {average:.4f}", flush=True)
            elif rank == 0:
                print(f"step {step}: loss {loss_meter}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
