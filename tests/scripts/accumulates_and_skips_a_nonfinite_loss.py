"""Gradient accumulation over 4 micro-batches under DDP: the first three backward under
no_sync() (no collective), the fourth all-reduces. A micro-batch with a non-finite loss is
skipped with `continue`. Skipped under no_sync, it costs nothing; skipped on the micro-batch
that synchronises, that rank makes one gradient all-reduce fewer. The data holds no NaN,
so a dry run never takes the branch."""

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUMULATE = 4


def main() -> None:
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        synchronising = (step + 1) % ACCUMULATE == 0
        with contextlib.nullcontext() if synchronising else model.no_sync():
            loss = F.mse_loss(model(x), y) / ACCUMULATE
            if not torch.isfinite(loss):
                continue
            loss.backward()
        if synchronising:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
