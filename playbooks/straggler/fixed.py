"""Fixed: rank 0 writes the checkpoint in the background and keeps training.

Cause: straggler.  Run: torchrun --nproc-per-node 2 fixed.py

The state is copied in memory and written by a background thread (what
torch.distributed.checkpoint.async_save does), so rank 0 reaches the next
all_reduce on time; a checkpoint due while the last write still runs is skipped,
and the write is awaited once, after the last collective.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import threading
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

    writer: threading.Thread | None = None
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        # FIX: copy now, write in the background; while the last write is still going,
        # skip this one (joining it here would hold rank 0 back from the next epoch's
        # collectives, the same straggler one epoch later)
        if rank == 0 and (writer is None or not writer.is_alive()):
            snapshot = {k: v.clone() for k, v in model.module.state_dict().items()}
            writer = threading.Thread(target=write_to_shared_storage, args=(snapshot, checkpoint))
            writer.start()
    dist.destroy_process_group()
    if writer is not None:
        writer.join()
        os.remove(checkpoint)  # a demonstration: leave no file behind


if __name__ == "__main__":
    main()
