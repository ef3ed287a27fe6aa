"""A healthy DDP job whose steps are longer than doctor's two looks: a DataLoader, three
wide layers, SGD; no explicit collective, so most of its time is spent in backward
(where DDP's all-reduce runs), at the same line with the same locals at both looks.
It trains for RUN_S seconds; doctor must call it progressing, not hung."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    width = int(os.environ.get("WIDTH", "1536"))
    model = DistributedDataParallel(nn.Sequential(*(nn.Linear(width, width) for _ in range(3))))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = TensorDataset(torch.randn(4096, width))
    loader = DataLoader(data, batch_size=1024)
    deadline = time.monotonic() + float(os.environ.get("RUN_S", "60"))
    step = 0
    while time.monotonic() < deadline:
        for (batch,) in loader:
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            step += 1
            if time.monotonic() > deadline:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
