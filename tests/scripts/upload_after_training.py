"""Train, tear the process group down, then rank 0 uploads the model for a long while
(an export to a model hub or object store): the distributed part has ended, so no
wait of rank 0's can hang a peer, however long it lasts."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def upload(state: dict[str, torch.Tensor]) -> None:
    time.sleep(3600)  # a slow link to the model store


def main() -> None:
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    for features, labels in DataLoader(data, batch_size=8, sampler=DistributedSampler(data)):
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()
    is_main = dist.get_rank() == 0
    dist.destroy_process_group()
    if is_main:
        upload(model.module.state_dict())


if __name__ == "__main__":
    main()
