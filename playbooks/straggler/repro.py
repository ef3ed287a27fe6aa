"""Rank 0 writes a checkpoint to slow storage while the others wait past the timeout.

Cause: straggler.  Run: torchrun --nproc-per-node 2 repro.py

Nothing is misaligned: every rank will reach the next gradient all_reduce. But
rank 0 writes the checkpoint synchronously to a shared filesystem that is slow
today (simulated: the write takes 1.2x the process-group timeout), and rank 1,
already in the next epoch's first all_reduce, gives up at the timeout
(REPRO_TIMEOUT_S).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TIMEOUT_S = float(os.environ.get("REPRO_TIMEOUT_S", "20"))  # short, to see the failure soon


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def write_to_shared_storage(state: dict[str, object], path: str) -> None:
    time.sleep(1.2 * TIMEOUT_S)  # a congested network filesystem
    torch.save(state, path)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    checkpoint = os.path.join(tempfile.gettempdir(), f"straggler-{run_id}.pt")

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        if rank == 0:  # BUG: the slow write blocks rank 0 while the others train on
            write_to_shared_storage(model.module.state_dict(), checkpoint)
    if rank == 0 and os.path.exists(checkpoint):  # a demonstration: leave no file behind
        os.remove(checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
