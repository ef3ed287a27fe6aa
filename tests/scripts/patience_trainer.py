"""A class trainer with early stopping, shared by patience_on_local_loss.py and its fixed
twin patience_on_reduced_loss.py: each subclass says how it validates and decides."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class EarlyStopper:
    """Stops after ``patience`` validations without a better loss: never within a dry run."""

    def __init__(self, patience: int = 50) -> None:
        self.patience, self.bad, self.best = patience, 0, float("inf")

    def should_stop(self, loss: float) -> bool:
        if loss < self.best - 1e-4:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def parts() -> tuple[DataLoader, DataLoader, DDP, torch.optim.Optimizer]:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    train = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    val = DataLoader(data, batch_size=64, sampler=DistributedSampler(data, shuffle=False))
    model = DDP(nn.Linear(8, 1))
    return train, val, model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_epoch(train: DataLoader, model: DDP, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    train.sampler.set_epoch(epoch)  # type: ignore[union-attr]
    for x, y in train:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
