"""Rank 0 saves in a background thread and, at each epoch's end, joins the last save
before starting the next: with a save slower than an epoch (36 min here), rank 0 waits
in that join while rank 1, done with its last epoch, exits. No rank is in a
collective; whether one follows on rank 0 decides whether the job hangs."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, epochs: int = 2) -> None:
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.net = DistributedDataParallel(nn.Linear(6, 3))
        self.opt = torch.optim.AdamW(self.net.parameters())
        samples = TensorDataset(torch.randn(96, 6), torch.randint(0, 3, (96,)))
        self.sampler = DistributedSampler(samples)
        self.batches = DataLoader(samples, batch_size=6, sampler=self.sampler)
        self.epochs = epochs
        self.saver: threading.Thread | None = None

    def _save(self, weights: dict[str, torch.Tensor]) -> None:
        time.sleep(36 * 60)  # the bucket is slow today

    def checkpoint(self) -> None:
        if self.saver is not None:
            self.saver.join()  # one save at a time
        weights = {name: t.clone() for name, t in self.net.module.state_dict().items()}
        self.saver = threading.Thread(target=self._save, args=(weights,), daemon=True)
        self.saver.start()

    def fit(self) -> None:
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.batches:
                self.opt.zero_grad()
                nn.functional.cross_entropy(self.net(x), y).backward()
                self.opt.step()
            if self.rank == 0:
                self.checkpoint()
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer().fit()
