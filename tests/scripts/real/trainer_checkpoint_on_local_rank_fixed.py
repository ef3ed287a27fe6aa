"""The fixed twin of trainer_checkpoint_on_local_rank.py: every rank calls
save_checkpoint() and only the write is under the rank test.

A class-based trainer as people write them for torchrun: the rank comes from the
environment in __init__, and the checkpoint method ends in a barrier ("wait until the
file is written"). BUG: it is called on local rank 0 only; the other rank runs on into
the next epoch's DDP backward and both wait forever (the fixed twin:
trainer_checkpoint_on_local_rank_fixed.py)."""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, epochs: int) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
        dist.init_process_group("gloo", timeout=timeout)
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        features = torch.randn(128, 16)
        dataset = TensorDataset(features, (features.sum(dim=1) > 0).long())
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=16, sampler=self.sampler)
        self.epochs = epochs
        self.folder = tempfile.mkdtemp(prefix="ckpt-")

    def train_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        for features, labels in self.loader:
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(features), labels)
            loss.backward()
            self.optimizer.step()

    def save_checkpoint(self, epoch: int) -> None:
        if self.local_rank == 0:
            torch.save(self.model.module.state_dict(), os.path.join(self.folder, f"epoch{epoch}.pt"))
        dist.barrier()  # every rank waits until the file is written

    def fit(self) -> None:
        for epoch in range(self.epochs):
            self.train_epoch(epoch)
            self.save_checkpoint(epoch)  # on every rank: it ends in a barrier
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer(epochs=3).fit()
