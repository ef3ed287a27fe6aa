"""Rank 0 alone evaluates through the DDP wrapper of a model with BatchNorm. The
script has no collective of its own in evaluate(): DDP broadcasts the buffers at
every forward(), in eval mode too, so rank 0 waits for ranks that went on to the
barrier. The loaders use worker processes, which must not outlive the dry run."""

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def evaluate(model: nn.Module, loader: DataLoader) -> None:
    model.eval()
    with torch.no_grad():
        for x in loader:
            model(x)  # forward(): DDP broadcasts the BatchNorm buffers
    model.train()


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader([torch.ones(4)] * 32, batch_size=4, num_workers=2)
    val_loader = DataLoader([torch.ones(4)] * 8, batch_size=4, num_workers=2)
    for _epoch in range(2):
        for x in train_loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        if dist.get_rank() == 0:
            evaluate(model, val_loader)
        dist.barrier()


if __name__ == "__main__":
    main()
