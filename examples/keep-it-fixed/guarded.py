"""The uneven-eval-batches reproducer with the guard's layers on (README, "Keep it fixed").

Run: torchrun --nproc-per-node 4 guarded.py        (GUARD=phase, the default)
     GUARD=watchdog torchrun --nproc-per-node 4 guarded.py

It reuses the playbook's reproducer as it is: the same hand-made validation shards
(4 batches on rank 0, 3 on ranks 1-3) and the same per-batch all_reduce. Only the
guard differs:

- GUARD=phase: ``aligned_phase("eval", steps=len(val_loader))`` before validation;
  every rank raises the same MisalignedPhase at once, naming the counts.
- GUARD=watchdog: ``watchdog(timeout=10, abort=True)`` at start-up; rank 0's fourth
  all_reduce waits, and after 10 s every rank reports where it waits and exits.
"""

from __future__ import annotations

import datetime
import os
import runpy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ncclcheck.guard import aligned_phase, watchdog

REPRO = Path(__file__).resolve().parents[2] / "playbooks" / "uneven-eval-batches" / "repro.py"
repro = runpy.run_path(str(REPRO))  # its functions; its main() does not run


def main() -> None:
    guard = os.environ.get("GUARD", "phase")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    if guard == "watchdog":
        watchdog(timeout=10, abort=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = repro["synthetic_dataset"](64, seed=0), repro["synthetic_dataset"](49, seed=1)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=4)
    for features, labels in DataLoader(Subset(train_set, range(rank, 64, world)), batch_size=4):
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()
    if guard == "phase":
        with aligned_phase("eval", steps=len(val_loader)):
            repro["validate"](model, val_loader)
    else:
        repro["validate"](model, val_loader)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
