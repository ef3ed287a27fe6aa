"""The PyTorch DDP tutorial's shape, as people copy it: the script starts its own ranks
with mp.spawn(main, args=(world_size,), nprocs=world_size), sets MASTER_ADDR/PORT itself
and passes the rank and world size to init_process_group. BUG (FIXED=0): only rank 0
evaluates, and the evaluation all-reduces its loss: the other ranks go on to the next
epoch's DDP gradient all_reduce, rank 0 waits in its own all_reduce. VAL_SAMPLES=N
evaluates on a validation set of N samples instead of the training data."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FIXED = os.environ.get("FIXED") == "1"


def setup(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("TUTORIAL_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = torch.zeros(1)
    with torch.no_grad():
        for features, labels in loader:
            total += F.cross_entropy(model(features), labels)
    dist.all_reduce(total)  # the mean over the ranks
    model.train()
    return total.item() / dist.get_world_size()


def demo_basic(rank: int, world_size: int) -> None:
    setup(rank, world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    train_loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    samples = int(os.environ.get("VAL_SAMPLES", "0"))  # a validation set of its own, this large
    val_data = TensorDataset(torch.randn(samples, 8), torch.randint(0, 2, (samples,))) if samples else data
    val_loader = DataLoader(val_data, batch_size=16, sampler=DistributedSampler(val_data, shuffle=False))
    for epoch in range(3):
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        if FIXED or rank == 0:
            loss = evaluate(model, val_loader)
            if rank == 0:
                print(f"epoch {epoch}: val loss {loss:.3f}", flush=True)
    dist.destroy_process_group()


def run_demo(demo_fn, world_size: int) -> None:  # type: ignore[no-untyped-def]
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    run_demo(demo_basic, 2)
