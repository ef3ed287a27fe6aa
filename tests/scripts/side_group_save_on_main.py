"""A Trainer that keeps its bookkeeping on a gloo side group, and saves its best model on
the main process only; the save totals the samples the job has seen, through that group.

Broken: only rank 0 saves, so its all-reduce on the side group waits for rank 1, which has
gone on to the next epoch's gradients on the default group: each waits in a group the
other is not in. MODE=fixed: every rank totals the samples, rank 0 alone writes.
"""

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FIXED = os.environ.get("MODE") == "fixed"


class Trainer:
    def __init__(self, epochs: int = 2) -> None:
        self.rank = dist.get_rank()
        self.side = dist.new_group(backend="gloo")  # bookkeeping off the training group
        self.model = DDP(nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        self.sampler = DistributedSampler(data)
        self.loader = DataLoader(data, batch_size=8, sampler=self.sampler)
        self.epochs, self.seen, self.best = epochs, 0, float("inf")
        self.folder = tempfile.mkdtemp(prefix="side-group-save-")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def total(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, group=self.side)
        return t.item()

    def train_epoch(self, epoch: int) -> float:
        self.sampler.set_epoch(epoch)
        running = 0.0
        for x, y in self.loader:
            self.opt.zero_grad()
            loss = nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            running += loss.item()
            self.seen += len(x)
        return self.total(running) / dist.get_world_size()

    def save(self, loss: float, seen: float) -> None:
        torch.save(
            {"model": self.model.module.state_dict(), "loss": loss, "seen": seen},
            os.path.join(self.folder, "best.pt"),
        )

    def fit(self) -> None:
        for epoch in range(self.epochs):
            loss = self.train_epoch(epoch)
            if loss < self.best:
                self.best = loss
                if FIXED:
                    seen = self.total(self.seen)
                    if self.is_main:
                        self.save(loss, seen)
                elif self.is_main:
                    self.save(loss, self.total(self.seen))


def main() -> None:
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("REPRO_TIMEOUT_S", "600")))
    )
    torch.manual_seed(0)
    Trainer().fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
