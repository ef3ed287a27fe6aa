"""A script written for `srun python train.py` (one task per GPU): its rank, local rank
and world size come from SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS, torchrun's
variables only where there is no srun. BUG (FIXED=0): only the first task validates,
and the validation all-reduces its loss."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def task_identity() -> tuple[int, int, int]:
    if "SLURM_PROCID" in os.environ:
        if "RANK" in os.environ:  # srun sets no RANK: a mix means someone else launched it
            raise SystemExit("SLURM_PROCID and RANK both set: not an srun task")
        env = os.environ
        return int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_NTASKS"])
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = torch.zeros(1)
    with torch.no_grad():
        for features, labels in loader:
            total += F.cross_entropy(model(features), labels)
    dist.all_reduce(total)
    model.train()
    return total.item() / dist.get_world_size()


def main() -> None:
    rank, local_rank, world_size = task_identity()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(local_rank)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    train_loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    val_loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))
    for _epoch in range(3):
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        if os.environ.get("FIXED") == "1" or rank == 0:
            validate(model, val_loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
