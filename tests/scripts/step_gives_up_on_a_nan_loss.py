"""A trainer's step gives up on a non-finite loss before its backward; the epoch loop
goes on to the next batch, and after the epoch every rank saves behind a barrier. Rank 1's
shard holds a NaN: it makes one gradient all-reduce fewer and reaches the barrier while
rank 0 still waits in its last backward."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self) -> None:
        self.model = DistributedDataParallel(nn.Linear(4, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def training_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        loss = F.mse_loss(self.model(x), y)
        if not torch.isfinite(loss):
            return None  # a corrupt batch: keep the optimizer state clean
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def fit(self, loader: DataLoader) -> None:
        for x, y in loader:
            if self.training_step(x, y) is None:
                continue
        dist.barrier()  # every rank has finished the epoch before the save


def main() -> None:
    dist.init_process_group("gloo")
    inputs, targets = torch.randn(32, 4), torch.randn(32, 1)
    inputs[5] = float("nan")  # in rank 1's shard (sample 5 of an unshuffled split)
    data = TensorDataset(inputs, targets)
    Trainer().fit(DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
