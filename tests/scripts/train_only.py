"""Training with no eval phase: preflight says so and checks the training loop."""

import datetime

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(64, 8, generator=gen)
    data = TensorDataset(features, (features.sum(dim=1) > 0).long())
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    for _epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
