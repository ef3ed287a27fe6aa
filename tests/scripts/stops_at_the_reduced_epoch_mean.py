"""stops_at_its_epoch_mean.py fixed: the epoch's loss sum and batch count are all-reduced
before the test, so every rank takes the stop at the same epoch."""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TARGET_LOSS = 1e-6


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(1000):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        totals = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach(), torch.tensor(1.0)])
        dist.all_reduce(totals)
        epoch_loss = (totals[0] / totals[1].clamp(min=1)).item()
        if math.isfinite(epoch_loss) and epoch_loss < TARGET_LOSS:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
