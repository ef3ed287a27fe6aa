"""Fixed: the same script on a healthy transport, with a timeout that fails fast.

Cause: transport-hang.  Run: torchrun --nproc-per-node 2 fixed.py

A dead link has no fix in the training script: the fix is in the cluster (the
interface NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME names, the NIC, the driver),
found with `ncclcheck probe`. What the script can do is fail fast instead of
after 30 minutes: the process-group timeout stays explicit (REPRO_TIMEOUT_S), and
on NCCL TORCH_NCCL_ASYNC_ERROR_HANDLING=1 turns the timeout into an exit.
"""

from __future__ import annotations

import datetime
import os

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


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set = synthetic_dataset(256, seed=0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))

    for features, labels in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(features), labels)
        loss.backward()  # DDP's gradient all_reduce: where every rank sits
        optimizer.step()
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    dist.barrier()  # leave together: gloo may abort a rank whose peer tore down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
