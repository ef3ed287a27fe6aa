"""Every rank is inside the same gradient all_reduce and nothing moves: the link is dead.

Cause: transport-hang.  Run: torchrun --nproc-per-node 2 repro.py

The code is aligned: both ranks reach the same DDP gradient all_reduce at the
same step. At step 3 rank 1's node stops answering in the middle of it (a dead
NIC, a hung driver; simulated here by freezing rank 1 with SIGSTOP once it is
inside the collective). Rank 0 waits in the same all_reduce until the
process-group timeout (REPRO_TIMEOUT_S). Only the transport is at fault, which is
what `ncclcheck probe` checks.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FAULT_STEP = 3


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 16, generator=gen)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(features, labels)


def inject_link_failure(rank: int) -> None:
    """Simulates the fault: rank 1 freezes once inside the collective; rank 0 arrives later."""
    if rank == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    else:
        time.sleep(1.0)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))

    for step, (features, labels) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        if step == FAULT_STEP:
            inject_link_failure(rank)
        loss.backward()  # DDP's gradient all_reduce: where every rank sits
        optimizer.step()
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
