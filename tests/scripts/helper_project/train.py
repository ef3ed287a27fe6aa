"""A project whose collective hides in a helper of another module."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from metrics import log_validation
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=gen)
    return TensorDataset(features, (features.sum(dim=1) > 0).long())


def main() -> None:
    # doctor's test hangs it: REPRO_TIMEOUT_S keeps the hang until doctor has looked
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "600")))
    dist.init_process_group("gloo", timeout=timeout)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = dataset(128, 0), dataset(32, 1)
    train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set))
    is_main = int(os.environ.get("RANK", "0")) == 0
    for _epoch in range(2):
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        if is_main:
            log_validation(model, val_loader)
        dist.barrier()


if __name__ == "__main__":
    main()
