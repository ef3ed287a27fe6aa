"""An aligned job whose evaluation is long (4,000 samples, 50 ms a batch): a dry run cut
short by a signal or a time limit is incomplete, not aligned."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(4000, 4))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    model = torch.nn.Linear(4, 1).eval()
    with torch.no_grad():
        for (inputs,) in loader:
            time.sleep(0.05)  # a real model's forward pass
            loss = model(inputs).mean()
            dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
