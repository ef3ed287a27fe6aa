"""Fixed: rank 0 writes inside the branch, and every rank reaches the barrier.

Cause: rank-early-exit.  Run: torchrun --nproc-per-node 2 fixed.py
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def save_checkpoint(model: DDP, optimizer: torch.optim.Optimizer, epoch: int, path: str) -> None:
    if dist.get_rank() == 0:  # FIX: only the write is rank-conditional
        state = {"model": model.module.state_dict(), "optim": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch}, path)
    dist.barrier()  # nobody reads the checkpoint before it is complete


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    checkpoint = os.path.join(tempfile.gettempdir(), f"early-exit-{run_id}.pt")

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        save_checkpoint(model, optimizer, epoch, checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
