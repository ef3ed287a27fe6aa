"""Early stopping on a holdout loss, each rank scoring the slice of the holdout set its
rank picks (``range(rank * n, (rank + 1) * n)``), so each rank's loss is its own. The
patience runs out after a few evaluations, past a short dry run: there the ranks stop
alike or not at all. The day one rank's loss stops improving first, it leaves the epoch
loop for the final all_reduce while the others train on. Its twin,
holdout_shard_patience_mean.py, averages the loss over the ranks before the stopper sees
it."""

import torch
import torch.distributed as dist
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


def holdout_loss(model: nn.Module, rows: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        return F.mse_loss(model(rows).squeeze(-1), targets).item()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    rows, targets = torch.randn(64, 8), torch.randn(64)
    per_rank = len(rows) // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stopper = Patience(patience=3)
    epochs = 0
    for _epoch in range(30):
        for _step in range(4):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(16, 8)).squeeze(-1), torch.randn(16)).backward()
            optimizer.step()
        epochs += 1
        loss = holdout_loss(model.module, rows[mine], targets[mine])
        if stopper.should_stop(loss):
            break
    summary = torch.tensor([float(epochs)])
    dist.all_reduce(summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
