"""What holdout_shard_patience.py and its twin share: the stopper, the holdout slice each
rank scores (chosen by its rank), the model and one epoch of training. No decision here."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Patience:
    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.waited = patience, float("inf"), 0

    def should_stop(self, value: float) -> bool:
        if value < self.best:
            self.best, self.waited = value, 0
            return False
        self.waited += 1
        return self.waited >= self.patience


def holdout_slice(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    rows, targets = torch.randn(64, 8), torch.randn(64)
    per_rank = len(rows) // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    return rows[mine], targets[mine]


def holdout_loss(model: nn.Module, rows: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        return F.mse_loss(model(rows).squeeze(-1), targets).item()


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = DistributedDataParallel(nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for _step in range(4):
        optimizer.zero_grad()
        F.mse_loss(model(torch.randn(16, 8)).squeeze(-1), torch.randn(16)).backward()
        optimizer.step()
