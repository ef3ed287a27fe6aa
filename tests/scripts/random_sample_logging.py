"""Each rank seeds Python's random with its rank, as people do so that augmentations
differ per rank, and the loop also uses it to decide when to log a sample's
predictions, which it gathers from every rank: the ranks draw different numbers, so
one gathers while the other goes on to its next DDP step. MODE=fixed: the decision is
drawn from a generator seeded alike on every rank."""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

LOG_PROBABILITY = 0.3


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    random.seed(1234 + rank)  # different augmentations on every rank
    shared = random.Random(1234)  # the same draws on every rank
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 6), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    model = DistributedDataParallel(nn.Linear(6, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for features, target in loader:
        features = features + random.gauss(0.0, 0.01)  # the per-rank augmentation
        prediction = model(features)
        loss = nn.functional.mse_loss(prediction, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        draw = shared.random() if os.environ.get("MODE") == "fixed" else random.random()
        if draw < LOG_PROBABILITY:
            samples = [torch.empty_like(prediction[:1]) for _ in range(world)]
            dist.all_gather(samples, prediction[:1].detach())
            if rank == 0:
                print("logged", [float(s) for s in samples], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
